//! storage
pub mod records;
pub mod agent_records;
