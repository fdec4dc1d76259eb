//! Outgoing inter-node TCP connections, optionally from a fixed source address.
//!
//! Every connection one node opens to another (controller RPC, a follower fetching from its
//! leader) goes through [`connect_from`]. With a source address set (`[cluster]
//! source_address`), the socket is bound to it before connecting, so the other side (or a
//! proxy in between) can tell which node a connection comes from by its peer IP: the
//! fault-injection harness (`tests/faults`) gives node `i` the address `127.0.0.(10+i)` and
//! cuts links between nodes by source and destination.
//!
//! ```no_run
//! # async fn example() -> std::io::Result<()> {
//! let source = Some("127.0.0.11".parse().unwrap());
//! let stream = sluice_cluster::net::connect_from("127.0.0.1:9093", source).await?;
//! # drop(stream); Ok(()) }
//! ```

use std::io;
use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpSocket, TcpStream};

/// Connects to `address` (`host:port`), from `source` (any free port) when it is set.
///
/// Tries every resolved address of the source's family in turn; without a source, the
/// system picks the source address as `TcpStream::connect` does.
pub async fn connect_from(address: &str, source: Option<IpAddr>) -> io::Result<TcpStream> {
    let Some(source) = source else {
        return TcpStream::connect(address).await;
    };
    assert!(!source.is_unspecified(), "a source address is a concrete address");
    let mut last_error = None;
    for target in tokio::net::lookup_host(address).await? {
        if target.is_ipv4() != source.is_ipv4() {
            continue;
        }
        match connect_one(target, source).await {
            Ok(stream) => return Ok(stream),
            Err(error) => last_error = Some(error),
        }
    }
    Err(last_error.unwrap_or_else(|| {
        io::Error::new(io::ErrorKind::AddrNotAvailable, format!("{address} has no address of the family of {source}"))
    }))
}

async fn connect_one(target: SocketAddr, source: IpAddr) -> io::Result<TcpStream> {
    let socket = if source.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.bind(SocketAddr::new(source, 0))?;
    let stream = socket.connect(target).await?;
    debug_assert_eq!(stream.local_addr()?.ip(), source);
    Ok(stream)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Connects to a local listener and returns the peer address the listener saw.
    async fn check(source: Option<IpAddr>) -> io::Result<IpAddr> {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
        let address = listener.local_addr()?.to_string();
        let (connected, accepted) = tokio::join!(connect_from(&address, source), listener.accept());
        let _stream = connected?;
        Ok(accepted?.1.ip())
    }

    #[tokio::test]
    async fn binds_to_the_source_address() {
        // All of 127.0.0.0/8 is loopback on Linux; elsewhere only 127.0.0.1 may be.
        let source: IpAddr = "127.0.0.12".parse().unwrap();
        if std::net::TcpListener::bind((source, 0)).is_ok() {
            assert_eq!(check(Some(source)).await.unwrap(), source);
        }
        let loopback: IpAddr = "127.0.0.1".parse().unwrap();
        assert_eq!(check(Some(loopback)).await.unwrap(), loopback);
        assert_eq!(check(None).await.unwrap(), loopback);
    }

    #[tokio::test]
    async fn refuses_a_target_of_another_family() {
        let error = connect_from("127.0.0.1:1", Some("::1".parse().unwrap())).await.unwrap_err();
        assert_eq!(error.kind(), io::ErrorKind::AddrNotAvailable);
    }
}
