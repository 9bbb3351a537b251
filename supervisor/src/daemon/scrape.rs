//! The metrics endpoint: `GET /metrics` over HTTP/1.1, on a loopback port or a Unix socket
//! ([`MetricsAt`]), answered with the OpenMetrics text of [`super::metrics`] and closed. A
//! scraper is anyone who can reach it, so it is held to little: 8 KiB of request head within 5
//! s, at most [`MAX_SCRAPES`] at once (more are closed unanswered), 10 s to take the answer —
//! a slow or hostile one stalls neither the launches nor the next scrape.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, UnixListener};
use tokio::sync::Semaphore;

use super::config::MetricsAt;
use super::{Context, Result};

/// Scrapes served at once.
const MAX_SCRAPES: usize = 4;
/// The longest request head read.
const MAX_HEAD: usize = 8 << 10;
/// Time a scraper has to send its request head.
const HEAD_TIMEOUT: Duration = Duration::from_secs(5);
/// Time a scraper has to take its answer.
const WRITE_TIMEOUT: Duration = Duration::from_secs(10);
/// The exposition's media type (OpenMetrics 1.0, which Prometheus asks for first).
const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// The endpoint's listening socket.
pub enum Endpoint {
    /// A loopback address.
    Tcp(TcpListener),
    /// A Unix socket, and its path (removed when the daemon stops).
    Unix(UnixListener, PathBuf),
}

/// Listen at `at`: a port in use, or a socket path another daemon listens on, stops the daemon
/// at its start.
pub async fn bind(at: &MetricsAt) -> Result<Endpoint> {
    Ok(match at {
        MetricsAt::Tcp(addr) => {
            let l = TcpListener::bind(addr).await.with_context(|| format!("metrics: listening on {addr}"))?;
            Endpoint::Tcp(l)
        }
        MetricsAt::Unix(path) => {
            let l = super::listen(path).with_context(|| format!("metrics: {}", path.display()))?;
            Endpoint::Unix(UnixListener::from_std(l)?, path.clone())
        }
    })
}

impl Endpoint {
    /// The Unix socket's path, to remove at the daemon's stop.
    pub fn path(&self) -> Option<&std::path::Path> {
        match self {
            Endpoint::Unix(_, p) => Some(p),
            Endpoint::Tcp(_) => None,
        }
    }
}

/// Serve scrapes until the task is dropped; `render` gives the exposition (None: it could not
/// be encoded, answered 500).
pub async fn serve(endpoint: Endpoint, render: Arc<dyn Fn() -> Option<String> + Send + Sync>) {
    let slots = Arc::new(Semaphore::new(MAX_SCRAPES));
    loop {
        let accepted = match &endpoint {
            Endpoint::Tcp(l) => l.accept().await.map(|(s, _)| Stream::Tcp(s)),
            Endpoint::Unix(l, _) => l.accept().await.map(|(s, _)| Stream::Unix(s)),
        };
        let stream = match accepted {
            Ok(s) => s,
            Err(e) => {
                // Out of descriptors (or the like): say so, and give the others a moment
                // rather than spin.
                tracing::warn!("metrics: accept: {e}");
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        // Too many scrapes at once: the newest is closed unanswered, never queued.
        let Ok(slot) = slots.clone().try_acquire_owned() else { continue };
        let render = render.clone();
        tokio::spawn(async move {
            let _slot = slot;
            match stream {
                Stream::Tcp(s) => answer(s, &*render).await,
                Stream::Unix(s) => answer(s, &*render).await,
            }
        });
    }
}

/// An accepted scraper.
enum Stream {
    Tcp(tokio::net::TcpStream),
    Unix(tokio::net::UnixStream),
}

/// Read one request head and answer it.
async fn answer<S: AsyncRead + AsyncWrite + Unpin>(mut stream: S, render: &(dyn Fn() -> Option<String> + Send + Sync)) {
    let head = match tokio::time::timeout(HEAD_TIMEOUT, read_head(&mut stream)).await {
        Ok(Some(head)) => head,
        Ok(None) => return,
        Err(_) => {
            let why = "no request head within 5 s\n";
            return respond(&mut stream, "408 Request Timeout", "text/plain; charset=utf-8", why, false).await;
        }
    };
    let (status, body, head_only) = match route(&head) {
        Route::Metrics { head_only } => match render() {
            Some(text) => ("200 OK", text, head_only),
            None => ("500 Internal Server Error", "the metrics could not be encoded\n".into(), false),
        },
        Route::Refused(status, why) => (status, why.into(), false),
    };
    let ty = if status.starts_with("200") { CONTENT_TYPE } else { "text/plain; charset=utf-8" };
    respond(&mut stream, status, ty, &body, head_only).await
}

enum Route {
    Metrics { head_only: bool },
    Refused(&'static str, &'static str),
}

/// What a request head asks for.
fn route(head: &str) -> Route {
    let line = head.lines().next().unwrap_or_default();
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version), None) = (parts.next(), parts.next(), parts.next(), parts.next())
    else {
        return Route::Refused("400 Bad Request", "not an HTTP request line\n");
    };
    if !version.starts_with("HTTP/1.") {
        return Route::Refused("505 HTTP Version Not Supported", "HTTP/1.0 or HTTP/1.1 only\n");
    }
    let path = target.split('?').next().unwrap_or_default();
    if path != "/metrics" {
        return Route::Refused("404 Not Found", "the metrics are at /metrics\n");
    }
    match method {
        "GET" => Route::Metrics { head_only: false },
        "HEAD" => Route::Metrics { head_only: true },
        _ => Route::Refused("405 Method Not Allowed", "GET or HEAD only\n"),
    }
}

/// The request head (up to its blank line); None: the scraper closed first or sent more than
/// [`MAX_HEAD`] without ending it.
async fn read_head<S: AsyncRead + Unpin>(stream: &mut S) -> Option<String> {
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    loop {
        let n = stream.read(&mut buf).await.ok()?;
        if n == 0 {
            return None;
        }
        head.extend_from_slice(&buf[..n]);
        let end = head.windows(4).position(|w| w == b"\r\n\r\n").or_else(|| head.windows(2).position(|w| w == b"\n\n"));
        if let Some(end) = end {
            head.truncate(end);
            return String::from_utf8(head).ok();
        }
        if head.len() > MAX_HEAD {
            return None;
        }
    }
}

/// Write the answer: its head, then `body` unless `head_only` (HEAD: the length it would have).
async fn respond<S: AsyncWrite + Unpin>(stream: &mut S, status: &str, ty: &str, body: &str, head_only: bool) {
    let body_sent = if head_only { "" } else { body };
    let text = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ty}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body_sent}",
        body.len()
    );
    let _ = tokio::time::timeout(WRITE_TIMEOUT, stream.write_all(text.as_bytes())).await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_get_and_head_of_the_metrics_path_are_answered() {
        let ok = |h: &str| matches!(route(h), Route::Metrics { .. });
        assert!(ok("GET /metrics HTTP/1.1\r\nHost: x"));
        assert!(ok("GET /metrics?name[]=x HTTP/1.0"));
        assert!(matches!(route("HEAD /metrics HTTP/1.1"), Route::Metrics { head_only: true }));
        for (head, status) in [
            ("GET / HTTP/1.1", "404"),
            ("GET /metrics/../x HTTP/1.1", "404"),
            ("POST /metrics HTTP/1.1", "405"),
            ("GET /metrics HTTP/2", "505"),
            ("GET /metrics", "400"),
            ("GET  /metrics HTTP/1.1", "400"),
            ("", "400"),
        ] {
            match route(head) {
                Route::Refused(s, _) => assert!(s.starts_with(status), "{head:?}: {s}"),
                Route::Metrics { .. } => panic!("{head:?} was answered"),
            }
        }
    }
}
