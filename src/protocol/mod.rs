//! protocol
pub mod messages;
