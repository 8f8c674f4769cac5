//! dev
