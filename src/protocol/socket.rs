//! What every agent link's TCP socket gets, on both ends: no Nagle delay
//! (frames are small and answered at once), and TCP keepalive, so a peer
//! that vanished without a FIN (a host powered off, a cable pulled) is
//! found by the kernel too, not only by the idle limit
//! ([`super::messages::idle_limit`]).

use std::time::Duration;

/// Probes start after this much silence, ...
const KEEPALIVE_IDLE: Duration = Duration::from_secs(30);
/// ... go out this often, ...
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
/// ... and this many unanswered close the connection.
const KEEPALIVE_PROBES: u32 = 3;

pub fn prepare(tcp: &tokio::net::TcpStream) -> std::io::Result<()> {
    tcp.set_nodelay(true)?;
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(KEEPALIVE_IDLE)
        .with_interval(KEEPALIVE_INTERVAL)
        .with_retries(KEEPALIVE_PROBES);
    socket2::SockRef::from(tcp).set_tcp_keepalive(&keepalive)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn link_sockets_get_keepalive_and_no_delay() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let tcp = tokio::net::TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        prepare(&tcp).unwrap();
        let sock = socket2::SockRef::from(&tcp);
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.tcp_keepalive_time().unwrap(), KEEPALIVE_IDLE);
        assert_eq!(sock.tcp_keepalive_interval().unwrap(), KEEPALIVE_INTERVAL);
        assert_eq!(sock.tcp_keepalive_retries().unwrap(), KEEPALIVE_PROBES);
        assert!(tcp.nodelay().unwrap());
    }
}
