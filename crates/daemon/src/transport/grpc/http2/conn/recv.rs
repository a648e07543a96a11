//! The frames that change a connection's state: SETTINGS, WINDOW_UPDATE, RST_STREAM and DATA
//! (flow control both ways, a unary body gathered under its bound, a task's body queued), and
//! resets and refusals (counted against the rapid-reset bound).

use super::*;

impl<IO, S> Connection<IO, S>
where
    IO: AsyncRead + AsyncWrite + Unpin,
    S: Service,
{
    pub(super) fn settings(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream != 0 {
            return Err(protocol("SETTINGS on a stream"));
        }
        if head.flags & frame::ACK != 0 {
            if !payload.is_empty() {
                return Err(Fail::Goaway(
                    Code::FrameSize,
                    "a SETTINGS ACK with a payload",
                ));
            }
            return Ok(());
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Fail::Goaway(
                Code::FrameSize,
                "SETTINGS not a multiple of 6",
            ));
        }
        for setting in payload.chunks_exact(6) {
            let id = u16::from_be_bytes([setting[0], setting[1]]);
            let value = u32::from_be_bytes([setting[2], setting[3], setting[4], setting[5]]);
            match id {
                frame::SETTINGS_ENABLE_PUSH if value > 1 => {
                    return Err(protocol("SETTINGS_ENABLE_PUSH above 1"));
                }
                frame::SETTINGS_INITIAL_WINDOW_SIZE => {
                    let value = i64::from(value);
                    if value > frame::MAX_WINDOW {
                        return Err(Fail::Goaway(
                            Code::FlowControl,
                            "SETTINGS_INITIAL_WINDOW_SIZE above 2^31-1",
                        ));
                    }
                    let delta = value - self.peer_initial_window;
                    self.peer_initial_window = value;
                    for stream in self.streams.values_mut() {
                        stream.send_window += delta;
                        if stream.send_window > frame::MAX_WINDOW {
                            return Err(Fail::Goaway(
                                Code::FlowControl,
                                "a stream window above 2^31-1",
                            ));
                        }
                    }
                }
                frame::SETTINGS_MAX_FRAME_SIZE => {
                    if !(16_384..=16_777_215).contains(&value) {
                        return Err(protocol("SETTINGS_MAX_FRAME_SIZE out of range"));
                    }
                    self.peer_max_frame = value as usize;
                }
                // The server never indexes what it sends, so the client's table size and
                // header list size do not bind it; unknown settings are ignored.
                _ => {}
            }
        }
        frame::settings_ack(&mut self.wbuf);
        if !self.settings_seen {
            self.settings_seen = true;
            self.service.shaken();
        }
        self.flush_all();
        Ok(())
    }

    pub(super) fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let bytes: [u8; 4] = payload
            .try_into()
            .map_err(|_| Fail::Goaway(Code::FrameSize, "WINDOW_UPDATE not 4 bytes"))?;
        let increment = i64::from(u32::from_be_bytes(bytes) & 0x7fff_ffff);
        if head.stream == 0 {
            if increment == 0 {
                return Err(protocol("a connection WINDOW_UPDATE of 0"));
            }
            self.send_window += increment;
            if self.send_window > frame::MAX_WINDOW {
                return Err(Fail::Goaway(
                    Code::FlowControl,
                    "the connection window above 2^31-1",
                ));
            }
            self.flush_all();
            return Ok(());
        }
        self.idle_check(head.stream)?;
        let Some(stream) = self.streams.get_mut(&head.stream) else {
            return Ok(());
        };
        if increment == 0 {
            return self.reset(head.stream, Code::Protocol);
        }
        stream.send_window += increment;
        if stream.send_window > frame::MAX_WINDOW {
            return self.reset(head.stream, Code::FlowControl);
        }
        self.flush(head.stream);
        Ok(())
    }

    /// A frame on a stream the client has not opened yet is a connection error.
    pub(super) fn idle_check(&self, stream: u32) -> Result<()> {
        if stream > self.last_stream {
            return Err(protocol("a frame on a stream not opened"));
        }
        Ok(())
    }

    pub(super) fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream == 0 {
            return Err(protocol("RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(Fail::Goaway(Code::FrameSize, "RST_STREAM not 4 bytes"));
        }
        self.idle_check(head.stream)?;
        if !self.streams.contains_key(&head.stream) {
            return Ok(());
        }
        self.close(head.stream);
        self.count_reset()
    }

    /// Counts a client reset or a refused stream; past the bound, the connection goes.
    pub(super) fn count_reset(&mut self) -> Result<()> {
        let now = Instant::now();
        if now.duration_since(self.resets_since) > RESET_PERIOD {
            self.resets_since = now;
            self.resets = 0;
        }
        self.resets += 1;
        if self.resets > MAX_RESETS {
            return Err(Fail::Goaway(
                Code::EnhanceYourCalm,
                "too many streams reset or refused",
            ));
        }
        Ok(())
    }

    /// Writes RST_STREAM for a stream the client may still send on; what it sends there
    /// next is ignored.
    pub(super) fn send_rst(&mut self, id: u32, code: Code) {
        frame::rst_stream(&mut self.wbuf, id, code);
        self.remember(id);
    }

    /// Remembers a stream the client may still send on without knowing it is closed.
    pub(super) fn remember(&mut self, id: u32) {
        if self.reset_by_us.len() == RESET_MEMORY {
            self.reset_by_us.pop_front();
        }
        self.reset_by_us.push_back(id);
    }

    /// Closes a stream either side reset: nothing more is sent or received on it, a task's body
    /// breaks off and the task is cancelled; a call being answered keeps its place until its
    /// check ends.
    fn close(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.recv_open = false;
        stream.done = true;
        stream.out.clear();
        match &mut stream.kind {
            Kind::Answering => return,
            Kind::Task { cancel, body, .. } => {
                if let Some(body) = body.take() {
                    let _ = body.send(Err(Broken));
                }
                cancel.cancel();
            }
            Kind::Gathering { .. } | Kind::Answered => {}
        }
        self.streams.remove(&id);
    }

    /// Resets one stream (a stream error).
    pub(super) fn reset(&mut self, id: u32, code: Code) -> Result<()> {
        self.send_rst(id, code);
        self.close(id);
        Ok(())
    }

    pub(super) fn data(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let id = head.stream;
        if id == 0 {
            return Err(protocol("DATA on stream 0"));
        }
        self.idle_check(id)?;
        // Flow control counts the whole payload, padding included.
        let len = payload.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return Err(Fail::Goaway(
                Code::FlowControl,
                "DATA past the connection window",
            ));
        }
        self.recv_unreleased += len;
        let data = frame::unpad(payload, head.flags)
            .ok_or_else(|| protocol("padding longer than the frame"))?;
        let end = head.flags & frame::END_STREAM != 0;
        let max_body = self.config.max_message_bytes.saturating_add(5);
        let window = self.config.stream_window;
        let Some(stream) = self.streams.get_mut(&id) else {
            // A stream already closed (reset, refused, answered): the client may not know yet.
            return Ok(());
        };
        if !stream.recv_open {
            return self.reset(id, Code::StreamClosed);
        }
        stream.recv_window -= i64::from(len);
        if stream.recv_window < 0 {
            return self.reset(id, Code::FlowControl);
        }
        stream.recv_unreleased += len;
        if end {
            stream.recv_open = false;
        }
        let mut over = None;
        let mut release = false;
        match &mut stream.kind {
            Kind::Gathering { body, .. } => {
                if body.len() + data.len() > max_body {
                    over = Some(Code::NoError);
                } else {
                    body.extend_from_slice(data);
                    release = !end;
                }
            }
            Kind::Task { body, queued, .. } => {
                let total = queued.fetch_add(data.len(), Ordering::AcqRel) + data.len();
                if total > max_body.saturating_add(window as usize) {
                    // The task does not take its body as fast as it comes.
                    over = Some(Code::EnhanceYourCalm);
                } else {
                    if let Some(sender) = body.as_ref().filter(|_| !data.is_empty()) {
                        let _ = sender.send(Ok(Bytes::copy_from_slice(data)));
                    }
                    if end {
                        body.take();
                    }
                    release = !end;
                }
            }
            Kind::Answering | Kind::Answered => {}
        }
        // The window is given back as the body is taken (it is bounded above).
        if release && stream.recv_unreleased >= window / 2 {
            let more = std::mem::take(&mut stream.recv_unreleased);
            stream.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, id, more);
        }
        match over {
            Some(Code::NoError) => {
                let status = Status::resource_exhausted(format!(
                    "request message over limits.max_body_bytes ({} bytes)",
                    self.config.max_message_bytes
                ));
                return self.refuse(id, status);
            }
            Some(code) => return self.reset(id, code),
            None => {}
        }
        if end {
            self.start_unary(id);
        }
        self.finish_if_done(id);
        Ok(())
    }

    /// Gives the connection's window back once half of it has been read.
    pub(super) fn release_connection_window(&mut self) {
        if self.recv_unreleased >= self.config.connection_window / 2 {
            let more = std::mem::take(&mut self.recv_unreleased);
            self.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, 0, more);
        }
    }

    /// Refuses a stream with a gRPC status (trailers only), counted.
    pub(super) fn refuse(&mut self, id: u32, status: Status) -> Result<()> {
        self.service.refused(&status);
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.kind = Kind::Answering;
        }
        self.answer(id, Err(status));
        Ok(())
    }

    /// The whole body is in: the call starts on the connection's task.
    pub(super) fn start_unary(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let Kind::Gathering { body, trace, .. } =
            std::mem::replace(&mut stream.kind, Kind::Answering)
        else {
            return;
        };
        let future = self.service.unary(trace, body.freeze());
        self.answering.push(Answering { id, future });
    }
}
