//! master
