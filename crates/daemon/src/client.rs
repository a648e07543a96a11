//! A small HTTP/1.1 client for the check API over TCP or the Unix socket (and the admin
//! listener), used by `sluice check`, `sluice counters` and the integration tests.

use std::net::SocketAddr;
use std::path::PathBuf;

use axum::http::{HeaderMap, Method, Request, StatusCode};
use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http1::{self, SendRequest};
use hyper_util::rt::TokioIo;
use tokio::net::{TcpStream, UnixStream};

use crate::limit::Descriptors;

/// Where the daemon listens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    /// HTTP over TCP.
    Tcp(SocketAddr),
    /// HTTP over a Unix socket.
    Unix(PathBuf),
}

impl std::fmt::Display for Target {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Tcp(addr) => write!(f, "http://{addr}"),
            Self::Unix(path) => write!(f, "unix:{}", path.display()),
        }
    }
}

impl Target {
    /// A TCP address as every client of sluice writes it (the CLI, the examples,
    /// `SLUICE_URL`): `http://127.0.0.1:7070`, `127.0.0.1:7070`, `localhost:7070`, `[::1]:7070`,
    /// with or without a trailing `/`. No TLS (sluice serves plain HTTP on loopback), no path.
    pub fn parse_http(text: &str) -> Result<Self, String> {
        use std::net::ToSocketAddrs;
        let bad =
            |why: &str| format!("{text:?} is not an address such as http://127.0.0.1:7070: {why}");
        let rest = match text.split_once("://") {
            None => text,
            Some(("http", rest)) => rest,
            Some((scheme, _)) => return Err(bad(&format!("scheme {scheme} (only http)"))),
        };
        let authority = rest.strip_suffix('/').unwrap_or(rest);
        if authority.contains(['/', '?', '#', '@']) {
            return Err(bad("a path, query or user is not part of an address"));
        }
        if let Ok(addr) = authority.parse::<SocketAddr>() {
            return Ok(Self::Tcp(addr));
        }
        let (host, port) = authority.rsplit_once(':').ok_or_else(|| bad("no port"))?;
        let port: u16 = port.parse().map_err(|_| bad("the port is not a number"))?;
        if host.is_empty() {
            return Err(bad("no host"));
        }
        (host, port)
            .to_socket_addrs()
            .map_err(|e| bad(&e.to_string()))?
            .next()
            .map(Self::Tcp)
            .ok_or_else(|| bad("the host has no address"))
    }
}

/// The admin path naming a counter: `/v1/counters?policy=P&d.NAME=VALUE...[&cost=N]`, every
/// value form-encoded.
pub fn counters_path(policy: &str, descriptors: &Descriptors, cost: Option<u64>) -> String {
    const PATH: &str = "/v1/counters?";
    let mut query = form_urlencoded::Serializer::for_suffix(String::from(PATH), PATH.len());
    query.append_pair("policy", policy);
    for (name, value) in descriptors {
        query.append_pair(&format!("d.{name}"), value);
    }
    if let Some(cost) = cost {
        query.append_pair("cost", &cost.to_string());
    }
    query.finish()
}

/// The daemon could not be reached or the exchange broke.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// Connecting failed.
    #[error("cannot connect to {target}: {source}")]
    Connect {
        /// Where.
        target: Target,
        /// Why.
        source: std::io::Error,
    },
    /// The HTTP exchange failed.
    #[error("HTTP exchange failed: {0}")]
    Http(#[from] hyper::Error),
    /// The request could not be built.
    #[error("bad request: {0}")]
    Request(#[from] axum::http::Error),
}

/// A response, read whole.
#[derive(Debug, Clone)]
pub struct Reply {
    /// Status code.
    pub status: StatusCode,
    /// Headers.
    pub headers: HeaderMap,
    /// Body bytes.
    pub body: Bytes,
}

impl Reply {
    /// A header's value as text, if present and valid.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers.get(name).and_then(|v| v.to_str().ok())
    }

    /// The body parsed as JSON (`Value::Null` if it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or(serde_json::Value::Null)
    }
}

/// One keep-alive connection to the daemon.
pub struct Connection {
    sender: SendRequest<Full<Bytes>>,
}

impl Connection {
    /// Connects to `target`.
    pub async fn open(target: &Target) -> Result<Self, ClientError> {
        let connect_err = |source| ClientError::Connect {
            target: target.clone(),
            source,
        };
        let sender = match target {
            Target::Tcp(addr) => {
                let stream = TcpStream::connect(addr).await.map_err(connect_err)?;
                let _ = stream.set_nodelay(true);
                handshake(TokioIo::new(stream)).await?
            }
            Target::Unix(path) => {
                let stream = UnixStream::connect(path).await.map_err(connect_err)?;
                handshake(TokioIo::new(stream)).await?
            }
        };
        Ok(Self { sender })
    }

    /// Sends one request and reads the whole response.
    pub async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<Vec<u8>>,
    ) -> Result<Reply, ClientError> {
        let json = body.is_some();
        self.exchange(method, path, json, Bytes::from(body.unwrap_or_default()))
            .await
    }

    /// POSTs a ready JSON body (no copy: for load generators).
    pub async fn post_bytes(&mut self, path: &str, body: Bytes) -> Result<Reply, ClientError> {
        self.exchange(Method::POST, path, true, body).await
    }

    async fn exchange(
        &mut self,
        method: Method,
        path: &str,
        json: bool,
        body: Bytes,
    ) -> Result<Reply, ClientError> {
        let mut builder = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "sluice");
        if json {
            builder = builder.header("content-type", "application/json");
        }
        let request = builder.body(Full::new(body))?;
        self.sender.ready().await?;
        let response = self.sender.send_request(request).await?;
        let (parts, body) = response.into_parts();
        let body = body.collect().await?.to_bytes();
        Ok(Reply {
            status: parts.status,
            headers: parts.headers,
            body,
        })
    }

    /// POSTs a JSON value.
    pub async fn post_json(
        &mut self,
        path: &str,
        value: &serde_json::Value,
    ) -> Result<Reply, ClientError> {
        self.send(Method::POST, path, Some(value.to_string().into_bytes()))
            .await
    }
}

async fn handshake<T>(io: TokioIo<T>) -> Result<SendRequest<Full<Bytes>>, ClientError>
where
    T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send + 'static,
{
    let (sender, connection) = http1::handshake(io).await?;
    tokio::spawn(async move {
        let _ = connection.await;
    });
    Ok(sender)
}

/// Opens a connection, sends one request, returns the response.
pub async fn request(
    target: &Target,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
) -> Result<Reply, ClientError> {
    Connection::open(target)
        .await?
        .send(method, path, body)
        .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_counter_path_encodes_every_value() {
        let descriptors: Descriptors = [("ip", "2001:db8::1"), ("user", "a b&c=d")]
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect();
        assert_eq!(
            counters_path("login", &descriptors, Some(2)),
            "/v1/counters?policy=login&d.ip=2001%3Adb8%3A%3A1&d.user=a+b%26c%3Dd&cost=2"
        );
        assert_eq!(
            counters_path("login", &Descriptors::new(), None),
            "/v1/counters?policy=login"
        );
    }
}
