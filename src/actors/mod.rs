//! actors
