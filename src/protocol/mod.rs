//! The master <-> agent protocol: the messages ([`messages`]), the framing
//! and bincode encoding on the wire ([`codec`]), and the version handshake
//! that opens every link ([`handshake`]), and the link's mutual TLS
//! ([`tls`]). DESIGN.md §10.
pub mod codec;
#[cfg(test)]
mod codec_props;
pub mod handshake;
pub mod messages;
pub mod socket;
pub mod tls;
