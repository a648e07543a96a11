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
            return self.idle_frame();
        }
        if self.settings_seen {
            // Every SETTINGS after the first costs an ACK and may touch every stream.
            self.idle_frame()?;
        }
        if !payload.len().is_multiple_of(6) {
            return Err(Fail::Goaway(
                Code::FrameSize,
                "SETTINGS not a multiple of 6",
            ));
        }
        let mut opened = false;
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
                    if delta != 0 {
                        for stream in self.streams.values_mut() {
                            stream.send_window += delta;
                            if stream.send_window > frame::MAX_WINDOW {
                                return Err(Fail::Goaway(
                                    Code::FlowControl,
                                    "a stream window above 2^31-1",
                                ));
                            }
                        }
                        opened |= delta > 0;
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
        if opened {
            // A larger initial window may unblock any stream with something queued.
            self.flush_all();
        }
        Ok(())
    }

    pub(super) fn window_update(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let bytes: [u8; 4] = payload
            .try_into()
            .map_err(|_| Fail::Goaway(Code::FrameSize, "WINDOW_UPDATE not 4 bytes"))?;
        self.idle_frame()?;
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
            self.flush_blocked();
            return Ok(());
        }
        match self.state(head.stream).recv(Recv::WindowUpdate) {
            Err(FrameError::Connection(code)) => {
                return Err(Fail::Goaway(code, "WINDOW_UPDATE on a stream not opened"))
            }
            // An increment of 0 is a stream error however the stream stands (RFC 9113 section
            // 6.9); on a stream we reset, ignored as every frame there is.
            Err(_) if increment == 0 && !self.reset_by_us.contains(&head.stream) => {
                self.send_rst(head.stream, Code::Protocol);
                return self.count_reset();
            }
            Err(_) => return Ok(()),
            Ok(_) => {}
        }
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

    /// Stream `id`'s state: kept, or forgotten (idle above the last stream opened, else
    /// closed: reset by us if the reset memory has it, else ended).
    pub(super) fn state(&self, id: u32) -> State {
        match self.streams.get(&id) {
            Some(stream) => stream.state,
            None => State::forgotten(
                id,
                self.last_stream,
                id <= self.last_stream && self.reset_by_us.contains(&id),
            ),
        }
    }

    pub(super) fn rst_stream(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        if head.stream == 0 {
            return Err(protocol("RST_STREAM on stream 0"));
        }
        if payload.len() != 4 {
            return Err(Fail::Goaway(Code::FrameSize, "RST_STREAM not 4 bytes"));
        }
        match self.state(head.stream).recv(Recv::RstStream) {
            Err(FrameError::Connection(code)) => {
                Err(Fail::Goaway(code, "RST_STREAM on a stream not opened"))
            }
            // Closed already: never a reset for a reset.
            Err(_) => Ok(()),
            Ok(_) => {
                self.close(head.stream, Closed::ResetByPeer);
                self.count_reset()
            }
        }
    }

    /// Counts a client reset or a refused stream; past the bound, the connection goes.
    pub(super) fn count_reset(&mut self) -> Result<()> {
        if self.resets.over(self.last_read, RESET_PERIOD, MAX_RESETS) {
            return Err(self.calm("too many streams reset or refused"));
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
    /// breaks off and the task is cancelled; a call being answered is dropped (a check not yet
    /// sent to the store is not sent) and the stream goes once the call is.
    pub(super) fn close(&mut self, id: u32, how: Closed) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        stream.state = State::Closed(how);
        self.out_total -= stream.out_bytes;
        stream.out_bytes = 0;
        stream.out.clear();
        match &mut stream.kind {
            Kind::Answering => {
                if let Some(call) = self.answering.iter_mut().find(|call| call.id == id) {
                    call.cancel();
                }
                return;
            }
            Kind::Task { cancel, body, .. } => {
                if let Some(body) = body.take() {
                    let _ = body.send(Err(Broken));
                }
                cancel.cancel();
            }
            Kind::Gathering { .. } | Kind::Answered => {}
        }
        self.remove(id);
    }

    /// Drops a stream: the body bytes it held give their connection window back.
    pub(super) fn remove(&mut self, id: u32) -> Option<Stream<S::Open>> {
        let stream = self.streams.remove(&id)?;
        if stream.conn_blocked {
            self.blocked.retain(|&blocked| blocked != id);
        }
        self.recv_unreleased += stream.held;
        self.out_total -= stream.out_bytes;
        Some(stream)
    }

    /// Resets one stream for the client's error (a stream error), counted against the reset
    /// bound as the client's own resets are.
    pub(super) fn reset(&mut self, id: u32, code: Code) -> Result<()> {
        self.send_rst(id, code);
        self.close(id, Closed::ResetByUs);
        self.count_reset()
    }

    /// Counts a frame that makes no progress (an empty DATA or CONTINUATION, PRIORITY, PING,
    /// SETTINGS, WINDOW_UPDATE, an unknown type); past the bound, the connection goes.
    pub(super) fn idle_frame(&mut self) -> Result<()> {
        if self
            .idle_frames
            .over(self.last_read, IDLE_PERIOD, MAX_IDLE_FRAMES)
        {
            return Err(self.calm("too many frames that make no progress"));
        }
        Ok(())
    }

    pub(super) fn data(&mut self, head: Head, payload: &[u8]) -> Result<()> {
        let id = head.stream;
        if id == 0 {
            return Err(protocol("DATA on stream 0"));
        }
        let end = head.flags & frame::END_STREAM != 0;
        let verdict = self.state(id).recv(Recv::Data { end_stream: end });
        if let Err(FrameError::Connection(code)) = verdict {
            return Err(Fail::Goaway(code, "DATA on a stream not open"));
        }
        // Flow control counts the whole payload, padding included.
        let len = payload.len() as u32;
        self.recv_window -= i64::from(len);
        if self.recv_window < 0 {
            return Err(Fail::Goaway(
                Code::FlowControl,
                "DATA past the connection window",
            ));
        }
        let data = frame::unpad(payload, head.flags)
            .ok_or_else(|| protocol("padding longer than the frame"))?;
        if data.is_empty() && !end {
            self.idle_frame()?;
        }
        // Padding is never held: its window goes back at once; the data's when it is taken.
        let size = data.len() as u32;
        self.recv_unreleased += len - size;
        let max_body = self.config.max_body_bytes;
        let window = self.config.stream_window;
        let Some(stream) = self.streams.get_mut(&id) else {
            // A stream already closed (reset, refused, answered): the client may not know yet.
            self.recv_unreleased += size;
            return Ok(());
        };
        let next = match verdict {
            Ok(next) => next,
            Err(FrameError::Stream(code)) => {
                self.recv_unreleased += size;
                return self.reset(id, code);
            }
            Err(_) => {
                // A stream we reset: the client may not know yet.
                self.recv_unreleased += size;
                return Ok(());
            }
        };
        stream.recv_window -= i64::from(len);
        if stream.recv_window < 0 {
            self.recv_unreleased += size;
            return self.reset(id, Code::FlowControl);
        }
        stream.received += u64::from(size);
        if !stream.length_agrees(end) {
            self.recv_unreleased += size;
            tracing::debug!("HTTP/2 request body disagrees with its content-length; reset");
            return self.reset(id, Code::Protocol);
        }
        stream.state = next;
        let mut over = false;
        let mut taken = size;
        match &mut stream.kind {
            Kind::Gathering { body, .. } => {
                if body.len() + data.len() > max_body {
                    over = true;
                } else {
                    body.extend_from_slice(data);
                    stream.held += size;
                    taken = 0;
                    // The stream's window is given back as the body comes: the body itself is
                    // bounded (`limits.max_body_bytes`), and the connection's window is not
                    // given back until the call is answered.
                    stream.recv_unreleased += len;
                }
            }
            Kind::Task { body, queued, .. } => {
                // The stream's window, as the connection's, is given back as the task takes
                // its body: a client that keeps to its window is held back, never reset.
                stream.recv_unreleased += len - size;
                if let Some(sender) = body.as_ref().filter(|_| !data.is_empty()) {
                    queued.fetch_add(data.len(), Ordering::AcqRel);
                    if sender.send(Ok(Bytes::copy_from_slice(data))).is_ok() {
                        stream.held += size;
                        taken = 0;
                    } else {
                        queued.fetch_sub(data.len(), Ordering::AcqRel);
                    }
                }
                if end {
                    body.take();
                }
            }
            Kind::Answering | Kind::Answered => {}
        }
        self.recv_unreleased += taken;
        if !end && stream.recv_unreleased >= window / 2 {
            let more = std::mem::take(&mut stream.recv_unreleased);
            stream.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, id, more);
        }
        if over {
            return self.refuse(id, Refused::BodyTooLarge);
        }
        if end {
            self.start_unary(id);
        }
        self.finish_if_done(id);
        Ok(())
    }

    /// Gives back the window of what the streams' tasks took since last asked.
    pub(super) fn taken_by_tasks(&mut self) {
        if !self.task_takes.any.swap(false, Ordering::AcqRel) {
            return;
        }
        let window = self.config.stream_window;
        for (&id, stream) in self.streams.iter_mut() {
            let Kind::Task { queued, .. } = &stream.kind else {
                continue;
            };
            let waiting = u32::try_from(queued.load(Ordering::Acquire)).unwrap_or(u32::MAX);
            let taken = stream.held.saturating_sub(waiting);
            if taken == 0 {
                continue;
            }
            stream.held -= taken;
            self.recv_unreleased += taken;
            stream.recv_unreleased += taken;
            if stream.state.recv_open() && stream.recv_unreleased >= window / 2 {
                let more = std::mem::take(&mut stream.recv_unreleased);
                stream.recv_window += i64::from(more);
                frame::window_update(&mut self.wbuf, id, more);
            }
        }
    }

    /// Gives the connection's window back once half of it has been taken (never what the
    /// streams and their calls still hold).
    pub(super) fn release_connection_window(&mut self) {
        if self.recv_unreleased >= self.config.connection_window / 2 {
            let more = std::mem::take(&mut self.recv_unreleased);
            self.recv_window += i64::from(more);
            frame::window_update(&mut self.wbuf, 0, more);
        }
    }

    /// Refuses a stream with the service's answer for `why`.
    pub(super) fn refuse(&mut self, id: u32, why: Refused) -> Result<()> {
        let answer = self.service.refuse(why);
        if let Some(stream) = self.streams.get_mut(&id) {
            stream.kind = Kind::Answering;
        }
        self.answer(id, Outcome::Answer(answer));
        Ok(())
    }

    /// The whole body is in: the call starts on the connection's task.
    pub(super) fn start_unary(&mut self, id: u32) {
        let Some(stream) = self.streams.get_mut(&id) else {
            return;
        };
        let Kind::Gathering {
            body,
            kept,
            refused,
            ..
        } = std::mem::replace(&mut stream.kind, Kind::Answering)
        else {
            return;
        };
        if let Some(why) = refused {
            let answer = self.service.refuse(why);
            self.answer(id, Outcome::Answer(answer));
            return;
        }
        let future = self.service.unary(kept, body.freeze());
        self.answering.push(Answering::new(id, future));
    }
}
