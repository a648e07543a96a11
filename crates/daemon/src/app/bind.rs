//! Binding the listeners, each named by its settings key in errors and warnings: TCP with a
//! chosen backlog (and `SO_REUSEADDR`, as std does), Unix sockets with `listen.socket_mode`,
//! `listen.socket_group` and the directory check.

use std::fmt::Display;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use tokio::net::{TcpListener, TcpSocket, UnixListener};

use super::StartError;
use crate::config::Listen;
use crate::transport::uds;

/// The kernel's queue of completed connections as std and tokio set it (`TcpListener::bind`).
pub(super) const STD_BACKLOG: u32 = 128;

/// Binds `addr` for the listener `key` names, queueing up to `backlog` connections the daemon
/// has not accepted yet; the listener and the address it got (the real port when `addr` asks
/// for port 0). Warns when the address is reachable beyond loopback.
pub(super) fn tcp(
    key: &str,
    addr: SocketAddr,
    backlog: u32,
) -> Result<(TcpListener, SocketAddr), StartError> {
    warn_if_exposed(key, addr);
    let bound = || {
        let socket = if addr.is_ipv4() {
            TcpSocket::new_v4()?
        } else {
            TcpSocket::new_v6()?
        };
        socket.set_reuseaddr(true)?;
        socket.bind(addr)?;
        let listener = socket.listen(backlog)?;
        let local = listener.local_addr()?;
        Ok((listener, local))
    };
    bound().map_err(|e| failed(key, &addr, e))
}

/// Binds the Unix socket `path` for the listener `key` names, with permission bits `mode`
/// (`listen.socket_mode`) and the socket settings of `[listen]` (group, whether its directory
/// is trusted); the listener and its path.
pub(super) fn uds(
    key: &str,
    path: &Path,
    mode: u32,
    listen: &Listen,
) -> Result<(UnixListener, PathBuf), StartError> {
    let group = listen.socket_group.as_ref().map(|g| g.gid);
    let listener = uds::bind(path, mode, group, listen.trust_socket_dir)
        .map_err(|e| failed(key, &path.display(), e))?;
    Ok((listener, path.to_path_buf()))
}

fn failed(key: &str, target: &dyn Display, error: std::io::Error) -> StartError {
    StartError::Bind(format!("cannot bind {key} {target}: {error}"))
}

fn warn_if_exposed(key: &str, addr: SocketAddr) {
    if !addr.ip().is_loopback() {
        tracing::warn!(%addr, key, "listening beyond loopback: anything that reaches this address can use it");
    }
}
