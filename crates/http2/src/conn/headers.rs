//! Request header blocks: HEADERS and CONTINUATION joined under the block bound, HPACK-decoded,
//! checked (RFC 9113 section 8.2-8.3: lower-case names, pseudo-headers first and once, no
//! connection-specific headers), and a new stream opened: a unary call gathered on the
//! connection, anything else handed to a task.

use super::*;

/// The request fields a unary call keeps ([`Service::KEPT`]): each value by the index of its
/// name there, the last one sent when a field is repeated.
#[derive(Debug, Default)]
pub struct Kept(Vec<(usize, Bytes)>);

impl Kept {
    /// The value of the field named `Service::KEPT[index]`, if the request sent it.
    pub fn get(&self, index: usize) -> Option<&[u8]> {
        self.0
            .iter()
            .find(|(at, _)| *at == index)
            .map(|(_, value)| &value[..])
    }

    fn keep(&mut self, index: usize, value: &[u8]) {
        let value = Bytes::copy_from_slice(value);
        match self.0.iter_mut().find(|(at, _)| *at == index) {
            Some(kept) => kept.1 = value,
            None => self.0.push((index, value)),
        }
    }
}

/// A request's head as decoded. A unary call's pseudo-headers are checked, not kept.
#[derive(Default)]
pub(super) struct RequestHead {
    pub(super) method: Option<Bytes>,
    /// `:method` is a token the service does not serve (`Service::METHODS`).
    pub(super) other_method: bool,
    /// Kept only for calls served on a task.
    pub(super) path: Option<Bytes>,
    pub(super) scheme: bool,
    pub(super) authority: Option<Bytes>,
    /// Decided by `:path`.
    pub(super) unary: Option<bool>,
    pub(super) regular: bool,
    /// Kept only for calls served on a task.
    pub(super) headers: Vec<(Bytes, Bytes)>,
    pub(super) kept: Kept,
    /// A pseudo-header was seen (trailers must have none).
    pub(super) pseudo: bool,
    /// `content-length`, when sent.
    pub(super) content_length: Option<u64>,
    pub(super) malformed: Option<&'static str>,
}

impl RequestHead {
    fn field<S: Service>(&mut self, name: &[u8], value: &[u8], service: &S) {
        if self.malformed.is_some() {
            return;
        }
        if let Some(pseudo) = name.strip_prefix(b":") {
            self.pseudo = true;
            if self.regular {
                self.malformed = Some("a pseudo-header after a regular header");
                return;
            }
            let repeated = match pseudo {
                b"method" => {
                    // A method that is not a token is malformed; a token the service does not
                    // serve is a request like any other, answered `Refused::Method`.
                    let method = match S::METHODS.iter().find(|&&m| m == value) {
                        Some(served) => Bytes::from_static(served),
                        None if !value.is_empty() && value.iter().all(|&b| is_tchar(b)) => {
                            self.other_method = true;
                            Bytes::new()
                        }
                        None => {
                            self.malformed = Some("a :method that is not a token");
                            return;
                        }
                    };
                    self.method.replace(method).is_some()
                }
                b"path" => {
                    if value.is_empty() {
                        self.malformed = Some("an empty :path");
                        return;
                    }
                    let unary = service.is_unary(value);
                    if !unary {
                        self.path = Some(Bytes::copy_from_slice(value));
                    }
                    self.unary.replace(unary).is_some()
                }
                // Any authority is taken (an Istio cluster name, a socket path).
                b"authority" => {
                    let copy = (self.unary != Some(true)).then(|| Bytes::copy_from_slice(value));
                    std::mem::replace(&mut self.authority, copy.or(Some(Bytes::new()))).is_some()
                }
                b"scheme" => std::mem::replace(&mut self.scheme, true),
                _ => {
                    self.malformed = Some("an unknown pseudo-header");
                    return;
                }
            };
            if repeated {
                self.malformed = Some("a repeated pseudo-header");
            }
            return;
        }
        self.regular = true;
        match name {
            b"connection" | b"keep-alive" | b"proxy-connection" | b"transfer-encoding"
            | b"upgrade" => {
                self.malformed = Some("a connection-specific header");
                return;
            }
            b"te" if value != b"trailers" => {
                self.malformed = Some("te other than trailers");
                return;
            }
            b"content-length" => {
                let length = std::str::from_utf8(value)
                    .ok()
                    .filter(|digits| digits.bytes().all(|b| b.is_ascii_digit()))
                    .and_then(|digits| digits.parse().ok());
                if length.is_none() || self.content_length.is_some() {
                    self.malformed = Some("a content-length that is not one number");
                    return;
                }
                self.content_length = length;
            }
            _ => {
                if let Some(index) = S::KEPT.iter().position(|&kept| kept == name) {
                    self.kept.keep(index, value);
                }
            }
        }
        if self.unary != Some(true) {
            self.headers
                .push((Bytes::copy_from_slice(name), Bytes::copy_from_slice(value)));
        }
    }
}

/// A token character (RFC 9110 section 5.6.2).
fn is_tchar(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b"!#$%&'*+-.^_`|~".contains(&b)
}

/// A header block arriving in HEADERS and CONTINUATION frames.
pub(super) struct Continuing {
    pub(super) stream: u32,
    pub(super) end_stream: bool,
    pub(super) block: BytesMut,
    /// CONTINUATION frames so far.
    pub(super) frames: u32,
    /// Its HEADERS made the stream depend on itself.
    pub(super) self_dependent: bool,
}

/// The stream a priority's first 4 bytes name (without the exclusive bit).
pub(super) fn dependency(bytes: &[u8]) -> u32 {
    bytes.get(..4).map_or(0, |b| {
        u32::from_be_bytes([b[0], b[1], b[2], b[3]]) & 0x7fff_ffff
    })
}

/// The request a task's service sees.
pub(super) fn http_request(
    method: &Bytes,
    path: &Bytes,
    authority: Option<&Bytes>,
    headers: &[(Bytes, Bytes)],
) -> std::result::Result<http::Request<()>, ()> {
    let uri = match authority {
        Some(authority) => http::Uri::builder()
            .scheme("http")
            .authority(authority.as_ref())
            .path_and_query(path.as_ref())
            .build(),
        None => http::Uri::builder().path_and_query(path.as_ref()).build(),
    }
    // An authority `http::Uri` does not take (an Istio cluster name) is not needed here.
    .or_else(|_| http::Uri::builder().path_and_query(path.as_ref()).build())
    .map_err(|_| ())?;
    let mut request = http::Request::builder()
        .method(http::Method::from_bytes(method).map_err(|_| ())?)
        .uri(uri)
        .version(http::Version::HTTP_2)
        .body(())
        .map_err(|_| ())?;
    let map = request.headers_mut();
    for (name, value) in headers {
        let name = HeaderName::from_bytes(name).map_err(|_| ())?;
        let value = HeaderValue::from_maybe_shared(value.clone()).map_err(|_| ())?;
        map.append(name, value);
    }
    Ok(request)
}

pub(super) static EMPTY: Bytes = Bytes::from_static(b"");

impl<IO, S> Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    pub(super) fn headers(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream == 0 {
            return Err(protocol("HEADERS on stream 0"));
        }
        let mut fragment = frame::unpad(payload, head.flags)
            .ok_or_else(|| protocol("padding longer than the frame"))?;
        let mut self_dependent = false;
        if head.flags & frame::PRIORITY_FLAG != 0 {
            self_dependent = fragment
                .get(..4)
                .is_some_and(|d| dependency(d) == head.stream);
            fragment = fragment
                .get(5..)
                .ok_or_else(|| protocol("HEADERS too short for its priority"))?;
        }
        let end_stream = head.flags & frame::END_STREAM != 0;
        if head.flags & frame::END_HEADERS != 0 {
            return self.header_block(head.stream, end_stream, self_dependent, fragment);
        }
        self.check_block_size(fragment.len())?;
        self.continuing = Some(Continuing {
            stream: head.stream,
            end_stream,
            self_dependent,
            block: BytesMut::from(fragment),
            frames: 0,
        });
        Ok(())
    }

    pub(super) fn continuation(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let Some(mut continuing) = self.continuing.take() else {
            return Err(protocol("CONTINUATION without HEADERS"));
        };
        self.check_block_size(continuing.block.len() + payload.len())?;
        continuing.frames += 1;
        if continuing.frames > MAX_CONTINUATIONS {
            return Err(self.calm("a header block in too many CONTINUATION frames"));
        }
        let last = head.flags & frame::END_HEADERS != 0;
        if payload.is_empty() && !last {
            self.continuing = Some(continuing);
            return self.idle_frame();
        }
        continuing.block.extend_from_slice(payload);
        if last {
            return self.header_block(
                continuing.stream,
                continuing.end_stream,
                continuing.self_dependent,
                &continuing.block,
            );
        }
        self.continuing = Some(continuing);
        Ok(())
    }

    /// A header block's encoded size is bounded before it is decoded: past the list's bound
    /// (and a margin for HPACK's framing), the connection goes (its HPACK state could not be
    /// kept without decoding the whole block).
    pub(super) fn check_block_size(&self, len: usize) -> Result<()> {
        if len > self.config.max_header_list + 1024 {
            return Err(Fail::Goaway(
                Code::EnhanceYourCalm,
                "a header block over the header list size",
            ));
        }
        Ok(())
    }

    /// A whole header block; `self_dependent`: its HEADERS made the stream depend on itself
    /// (RFC 9113 section 5.3.1: a stream error, taken as a malformed request once the block is
    /// decoded, since the HPACK state goes on).
    pub(super) fn header_block(
        &mut self,
        id: u32,
        end_stream: bool,
        self_dependent: bool,
        block: &[u8],
    ) -> Result<()> {
        let mut request = RequestHead::default();
        let service = &*self.service;
        let decoded = self
            .decoder
            .decode(block, self.config.max_header_list, |name, value| {
                request.field(name, value, service);
            })
            .map_err(|error| Fail::Goaway(Code::Compression, error.0))?;
        if let Some(problem) = decoded.malformed {
            request.malformed.get_or_insert(problem);
        }
        if self_dependent {
            request
                .malformed
                .get_or_insert("a stream that depends on itself");
        }
        if let Some(stream) = self.streams.get_mut(&id) {
            // Trailers: they must end the stream and carry no pseudo-header; their content is
            // not used otherwise.
            let next = match stream.state.recv(Recv::Headers { end_stream }) {
                Ok(next) => next,
                Err(FrameError::Stream(code)) => return self.reset(id, code),
                Err(FrameError::Connection(code)) => {
                    return Err(Fail::Goaway(code, "HEADERS on a closed stream"))
                }
                Err(FrameError::Ignored) => return Ok(()),
            };
            if request.pseudo || request.malformed.is_some() || !stream.length_agrees(true) {
                return self.reset(id, Code::Protocol);
            }
            stream.state = next;
            if let Kind::Gathering { .. } = stream.kind {
                self.start_unary(id);
            } else if let Kind::Task { body, .. } = &mut stream.kind {
                body.take();
            }
            self.finish_if_done(id);
            return Ok(());
        }
        let state = match self.state(id).recv(Recv::Headers { end_stream }) {
            Ok(state) => state,
            // Trailers on a stream we reset: the client may not know yet.
            Err(FrameError::Ignored) => return Ok(()),
            // Frames after the client ended its latest stream (section 5.1); a lower id is
            // an unexpected one (section 5.1.1), below.
            Err(FrameError::Connection(Code::StreamClosed)) if id == self.last_stream => {
                return Err(Fail::Goaway(
                    Code::StreamClosed,
                    "HEADERS on a closed stream",
                ))
            }
            // Anything else opens a stream below one already opened.
            Err(_) => return Err(protocol("a new stream id not above the last one")),
        };
        if id.is_multiple_of(2) {
            return Err(protocol("a client stream with an even id"));
        }
        self.last_stream = id;
        if self.going {
            // Not processed: the GOAWAY's last stream id tells the client to retry it; what
            // it sends there meanwhile is ignored.
            self.remember(id);
            return Ok(());
        }
        self.taken = id;
        if self.streams.len() >= self.config.max_concurrent_streams as usize {
            self.send_rst(id, Code::RefusedStream);
            return self.count_reset();
        }
        if !self.charge.room(self.held()) {
            // The listeners are over their memory budget and this connection over its share.
            self.charge.budget().refuse(Refusal::Stream);
            self.send_rst(id, Code::RefusedStream);
            return self.count_reset();
        }
        if let Some(reason) = request.malformed {
            tracing::debug!(reason, "malformed HTTP/2 request headers; stream reset");
            self.send_rst(id, Code::Protocol);
            return self.count_reset();
        }
        let (Some(method), Some(unary), true) = (&request.method, request.unary, request.scheme)
        else {
            self.send_rst(id, Code::Protocol);
            return self.count_reset();
        };
        if end_stream && request.content_length.is_some_and(|declared| declared != 0) {
            self.send_rst(id, Code::Protocol);
            return self.count_reset();
        }
        let mut stream = Stream {
            state,
            recv_window: i64::from(self.config.stream_window),
            recv_unreleased: 0,
            held: 0,
            received: 0,
            content_length: request.content_length,
            conn_blocked: false,
            send_window: self.peer_initial_window,
            kind: Kind::Answering,
            out: VecDeque::new(),
            out_bytes: 0,
            _open: self.service.opened(),
        };
        if decoded.oversized {
            self.streams.insert(id, stream);
            // Counted as a refusal: a client that keeps sending oversized lists (an HPACK
            // bomb) costs a decode each and goes past the bound.
            self.count_reset()?;
            return self.refuse(id, Refused::HeadersTooLarge);
        }
        // A method the service does not serve is gathered as a unary call's body is (within
        // the same bounds) and then answered as the service words it (RFC 9110's 405): the
        // stream lives out its life as any other's, and the client ends its side first.
        if unary || request.other_method {
            stream.kind = Kind::Gathering {
                body: BytesMut::new(),
                kept: std::mem::take(&mut request.kept),
                // From the read that brought the headers: no second look at the clock.
                by: later(self.last_read, self.config.body_read_timeout),
                refused: request.other_method.then_some(Refused::Method),
            };
            self.streams.insert(id, stream);
            if end_stream {
                self.start_unary(id);
            } else {
                self.partial = true;
            }
            return Ok(());
        }
        let path = request.path.as_ref().unwrap_or(&EMPTY);
        let http = match http_request(method, path, request.authority.as_ref(), &request.headers) {
            Ok(http) => http,
            Err(()) => {
                drop(stream);
                self.send_rst(id, Code::Protocol);
                return self.count_reset();
            }
        };
        let (sender, receiver) = mpsc::unbounded_channel();
        let queued = Arc::new(AtomicUsize::new(0));
        let cancel = self.ended.child_token();
        let body = RecvBody {
            receiver,
            queued: Arc::clone(&queued),
            taken: Arc::clone(&self.task_takes),
        };
        stream.kind = Kind::Task {
            body: (!end_stream).then_some(sender),
            queued,
            cancel: cancel.clone(),
        };
        self.streams.insert(id, stream);
        let responder = Responder::new(id, self.events.clone());
        let future = self.service.stream(http.map(|()| body), responder);
        tokio::spawn(drive(id, future, self.events.clone(), cancel));
        Ok(())
    }
}
