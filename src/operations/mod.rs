//! operations
