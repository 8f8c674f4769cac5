//! The master <-> agent protocol: the messages ([`messages`]), the framing
//! and bincode encoding on the wire ([`codec`]), and the version handshake
//! that opens every link ([`handshake`]). DESIGN.md §10.
pub mod codec;
pub mod handshake;
pub mod messages;
