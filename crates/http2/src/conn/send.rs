//! What a connection writes: a unary call's answer (constant header blocks around one DATA
//! frame), a task's answer as its events come, DATA within the client's windows, a stream's end;
//! and its timers (a stalled body, the keepalive PING).

use super::*;

pub(super) fn encode_headers(headers: &HeaderMap, block: &mut BytesMut) {
    for (name, value) in headers {
        hpack::encode_literal(name.as_str().as_bytes(), value.as_bytes(), block);
    }
}

/// Writes a header block as HEADERS and, past the client's frame size, CONTINUATION frames.
pub(super) fn write_block(
    out: &mut BytesMut,
    id: u32,
    block: &[u8],
    end_stream: bool,
    max_frame: usize,
) {
    let mut chunks = block.chunks(max_frame.max(1));
    let first = chunks.next().unwrap_or(&[]);
    let rest = chunks.len();
    let mut flags = if end_stream { frame::END_STREAM } else { 0 };
    if rest == 0 {
        flags |= frame::END_HEADERS;
    }
    frame::head(out, first.len(), frame::HEADERS, flags, id);
    out.put_slice(first);
    for (i, chunk) in chunks.enumerate() {
        let flags = if i + 1 == rest { frame::END_HEADERS } else { 0 };
        frame::head(out, chunk.len(), frame::CONTINUATION, flags, id);
        out.put_slice(chunk);
    }
}

/// `:status` (RFC 7541 Appendix A: static-table entry 8, `200` is entry 8 whole).
pub(super) const STATUS_200: u8 = 0x88;

pub(super) const STATUS_NAME: usize = 8;

/// Appends `block` encoded.
fn put_block(block: &Block, out: &mut BytesMut) {
    match block {
        Block::Encoded(encoded) => out.put_slice(encoded),
        Block::Fields(fields) => encode_headers(fields, out),
    }
}

/// Writes `block` as a header block (a constant as it is).
fn write_any_block(out: &mut BytesMut, id: u32, block: &Block, end_stream: bool, max_frame: usize) {
    match block {
        Block::Encoded(encoded) => write_block(out, id, encoded, end_stream, max_frame),
        Block::Fields(fields) => {
            let mut encoded = BytesMut::with_capacity(64);
            encode_headers(fields, &mut encoded);
            write_block(out, id, &encoded, end_stream, max_frame);
        }
    }
}

/// `block` encoded, as bytes to queue (a constant is not copied).
fn block_bytes(block: Block) -> Bytes {
    match block {
        Block::Encoded(encoded) => Bytes::from_static(encoded),
        Block::Fields(fields) => {
            let mut out = BytesMut::with_capacity(64);
            encode_headers(&fields, &mut out);
            out.freeze()
        }
    }
}

impl<IO, S> Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    /// A unary call's answer, written (or queued for the client's window).
    pub(super) fn answer(&mut self, id: u32, outcome: Outcome) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.kind = Kind::Answered;
        // The call is over: the body it held gives its connection window back.
        self.recv_unreleased += std::mem::take(&mut stream.held);
        if stream.state.sent_end() {
            // Reset while it was being answered: its place is free now.
            self.remove(id);
            return;
        }
        let answer = match outcome {
            Outcome::Answer(answer) => answer,
            Outcome::Panicked => self.service.refuse(Refused::Panicked),
            Outcome::Cancelled => {
                // Only a reset cancels a call, and a reset stream is done: not reached.
                self.close(id, Closed::ResetByUs);
                return;
            }
        };
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        match answer {
            Answer::Whole {
                head,
                body,
                trailers,
            } => {
                write_any_block(&mut self.wbuf, id, &head, false, self.peer_max_frame);
                let room = self.send_window.min(stream.send_window);
                if stream.out.is_empty()
                    && body.len() <= self.peer_max_frame
                    && i64::try_from(body.len()).is_ok_and(|len| len <= room)
                {
                    // The usual case, written at once: nothing queued, nothing allocated.
                    let len = body.len();
                    frame::head(&mut self.wbuf, len, frame::DATA, 0, id);
                    self.wbuf.put_slice(&body);
                    self.send_window -= len as i64;
                    stream.send_window -= len as i64;
                    write_any_block(&mut self.wbuf, id, &trailers, true, self.peer_max_frame);
                    stream.state = stream.state.send_end();
                } else {
                    let body = body.freeze();
                    stream.out_bytes += body.len();
                    self.out_total += body.len();
                    stream.out.push_back(Out::Data(body));
                    stream.out.push_back(Out::Trailers(block_bytes(trailers)));
                }
            }
            Answer::Bodiless { head, trailers } => {
                let mut block = BytesMut::with_capacity(64);
                put_block(&head, &mut block);
                put_block(&trailers, &mut block);
                write_block(&mut self.wbuf, id, &block, true, self.peer_max_frame);
                stream.state = stream.state.send_end();
            }
        }
        self.flush(id);
    }

    pub(super) fn event(&mut self, event: Event) {
        let id = match &event {
            Event::Head(id, ..)
            | Event::Data(id, _)
            | Event::Trailers(id, _)
            | Event::End(id)
            | Event::Gone(id) => *id,
        };
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        if stream.state.sent_end() {
            return;
        }
        match event {
            Event::Head(_, status, headers) => {
                let mut block = BytesMut::with_capacity(64);
                if status == StatusCode::OK {
                    block.put_u8(STATUS_200);
                } else {
                    hpack::encode_literal_indexed_name(
                        STATUS_NAME,
                        status.as_str().as_bytes(),
                        &mut block,
                    );
                }
                encode_headers(&headers, &mut block);
                write_block(&mut self.wbuf, id, &block, false, self.peer_max_frame);
            }
            Event::Data(_, data) => {
                stream.out_bytes += data.len();
                self.out_total += data.len();
                stream.out.push_back(Out::Data(data));
                if self.out_total > MAX_QUEUED_OUT {
                    tracing::debug!(
                        "an HTTP/2 client left its window closed with 256 KiB queued; stream reset"
                    );
                    self.send_rst(id, Code::Cancel);
                    self.close(id, Closed::ResetByUs);
                    return;
                }
            }
            Event::Trailers(_, trailers) => {
                let mut block = BytesMut::with_capacity(64);
                encode_headers(&trailers, &mut block);
                stream.out.push_back(Out::Trailers(block.freeze()));
            }
            Event::End(_) => stream.out.push_back(Out::End),
            Event::Gone(_) => {
                if !matches!(stream.out.back(), Some(Out::Trailers(_) | Out::End)) {
                    // The call ended without ending its answer.
                    tracing::debug!("an HTTP/2 streamed call ended without its answer's end");
                    self.send_rst(id, Code::Internal);
                    self.close(id, Closed::ResetByUs);
                }
                return;
            }
        }
        self.flush(id);
    }

    /// Writes what the streams blocked on the connection's window have queued, in the order
    /// they were blocked, while the window lasts: a WINDOW_UPDATE visits only the streams it
    /// unblocks.
    pub(super) fn flush_blocked(&mut self) {
        while self.send_window > 0 {
            let Some(id) = self.blocked.pop_front() else {
                return;
            };
            if let Some(stream) = self.streams.get_mut(&id) {
                stream.conn_blocked = false;
                self.flush(id);
            }
        }
    }

    /// Writes what every stream has queued, as far as the windows allow (a larger initial
    /// window: every stream's window changed).
    pub(super) fn flush_all(&mut self) {
        let ids: Vec<u32> = self
            .streams
            .iter()
            .filter(|(_, s)| !s.out.is_empty())
            .map(|(&id, _)| id)
            .collect();
        for id in ids {
            self.flush(id);
        }
    }

    /// Writes what one stream has queued, as far as the windows allow.
    pub(super) fn flush(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        while let Some(out) = stream.out.front_mut() {
            match out {
                Out::Data(data) => {
                    let room = self
                        .send_window
                        .min(stream.send_window)
                        .min(self.peer_max_frame as i64);
                    if room <= 0 && !data.is_empty() {
                        if self.send_window <= 0 && !stream.conn_blocked {
                            stream.conn_blocked = true;
                            self.blocked.push_back(id);
                        }
                        return;
                    }
                    let n = data.len().min(usize::try_from(room).unwrap_or(0));
                    frame::head(&mut self.wbuf, n, frame::DATA, 0, id);
                    self.wbuf.put_slice(&data[..n]);
                    data.advance(n);
                    self.send_window -= n as i64;
                    stream.send_window -= n as i64;
                    stream.out_bytes -= n;
                    self.out_total -= n;
                    if data.is_empty() {
                        stream.out.pop_front();
                    }
                }
                Out::Trailers(block) => {
                    write_block(&mut self.wbuf, id, &block[..], true, self.peer_max_frame);
                    stream.out.pop_front();
                    stream.state = stream.state.send_end();
                }
                Out::End => {
                    frame::head(&mut self.wbuf, 0, frame::DATA, frame::END_STREAM, id);
                    stream.out.pop_front();
                    stream.state = stream.state.send_end();
                }
            }
        }
        self.finish_if_done(id);
    }

    /// Drops a stream both sides are done with; tells a client still sending that its
    /// answer is complete.
    pub(super) fn finish_if_done(&mut self, id: u32) {
        let Some(stream) = self.streams.get(&id) else {
            return;
        };
        // A call still being answered keeps its place, reset or not.
        if !stream.state.sent_end() || matches!(stream.kind, Kind::Answering) {
            return;
        }
        if stream.state.recv_open() {
            // The client is still sending: tell it the answer is complete.
            self.send_rst(id, Code::NoError);
        }
        if let Some(Stream {
            kind: Kind::Task { cancel, .. },
            ..
        }) = self.remove(id)
        {
            cancel.cancel();
        }
    }

    /// Arms the timer for the earliest body deadline of a stream still gathering its body.
    pub(super) fn arm_stream_deadlines(&mut self) {
        let earliest = self
            .streams
            .values()
            .filter_map(|stream| match &stream.kind {
                Kind::Gathering { by, .. } => Some(*by),
                _ => None,
            })
            .min();
        if let Some(by) = earliest {
            self.arm(by);
        }
    }

    pub(super) fn arm(&mut self, at: Instant) {
        if at < self.timer_at {
            self.timer_at = at;
            self.timer.as_mut().reset(at);
        }
    }

    pub(super) fn on_timer(&mut self) -> Result<()> {
        let now = Instant::now();
        let stalled: Vec<u32> = self
            .streams
            .iter()
            .filter_map(|(&id, stream)| match &stream.kind {
                Kind::Gathering { by, .. } if *by <= now => Some(id),
                _ => None,
            })
            .collect();
        for id in stalled {
            // Answered, then reset (the client is still sending).
            self.refuse(id, Refused::BodyTimeout)?;
        }
        if let Some(sent) = self.ping_sent {
            if now.duration_since(sent) >= self.config.keepalive_timeout {
                tracing::debug!("HTTP/2 client did not answer a keepalive PING; closed");
                return Err(Fail::Gone);
            }
        } else if now.duration_since(self.last_read) >= self.config.keepalive_interval {
            frame::ping(&mut self.wbuf, 0, KEEPALIVE_PING);
            self.ping_sent = Some(now);
        }
        let next = match self.ping_sent {
            Some(sent) => later(sent, self.config.keepalive_timeout),
            None => later(self.last_read, self.config.keepalive_interval),
        };
        let next = next.max(now + Duration::from_millis(1));
        self.timer_at = next;
        self.timer.as_mut().reset(next);
        self.arm_stream_deadlines();
        Ok(())
    }
}
