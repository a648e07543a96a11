//! The `code` label of the gRPC transport's responses, as a bounded enum.

use super::proto::envoy::service::ratelimit::v3::rate_limit_response::Code;

/// A value of the `code` label of `sluice_http_responses_total` on the gRPC transport: the
/// answer's overall code, or the status a request was refused with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum GrpcCode {
    /// Answered `OK`.
    Ok,
    /// Answered `OVER_LIMIT`.
    OverLimit,
    /// Refused: a malformed request or message.
    InvalidArgument,
    /// Refused: the message did not arrive within `limits.body_read_timeout`.
    DeadlineExceeded,
    /// Refused: the message is over `limits.max_body_bytes`.
    ResourceExhausted,
    /// Refused: the request stream broke off.
    Cancelled,
}

impl GrpcCode {
    /// Every value.
    pub const ALL: [Self; 6] = [
        Self::Ok,
        Self::OverLimit,
        Self::InvalidArgument,
        Self::DeadlineExceeded,
        Self::ResourceExhausted,
        Self::Cancelled,
    ];

    /// The metric label.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::OverLimit => "over_limit",
            Self::InvalidArgument => "invalid_argument",
            Self::DeadlineExceeded => "deadline_exceeded",
            Self::ResourceExhausted => "resource_exhausted",
            Self::Cancelled => "cancelled",
        }
    }

    /// The label of an answer, by its overall code.
    pub(super) fn of_code(overall: Code) -> Self {
        if overall == Code::Ok {
            Self::Ok
        } else {
            Self::OverLimit
        }
    }

    /// The label of a refusal with `code` (a bounded set: anything else is `invalid_argument`).
    pub fn of_status(code: tonic::Code) -> Self {
        match code {
            tonic::Code::DeadlineExceeded => Self::DeadlineExceeded,
            tonic::Code::ResourceExhausted => Self::ResourceExhausted,
            tonic::Code::Cancelled => Self::Cancelled,
            _ => Self::InvalidArgument,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::GrpcCode;

    /// The labels dashboards name, all in the metric's doc comment.
    #[test]
    fn response_labels_are_the_published_ones() {
        let labels = GrpcCode::ALL.map(GrpcCode::as_str);
        assert_eq!(
            labels,
            [
                "ok",
                "over_limit",
                "invalid_argument",
                "deadline_exceeded",
                "resource_exhausted",
                "cancelled",
            ]
        );
        crate::telemetry::assert_doc_lists("responses", labels);
    }
}
