//! A broker for unit tests: a [`Gateway`] that answers each request with what a test's
//! [`Answers`] says, takes no logins and knows no queue depths or batches. Tests of a
//! refusal the real broker gives only under a race (a leader that has not applied a topic
//! yet) script the refusal here.

use kafka_protocol::messages::{RequestKind, ResponseKind};

use crate::gateway::{Gateway, GatewayFuture, QueueDepth, Session};

/// What a test's broker answers to a request (`None`: no answer).
pub(crate) trait Answers: Send + Sync + 'static {
    fn answer(&self, request: &RequestKind) -> Option<ResponseKind>;
}

/// The gateway of a test, answering through `.0`.
pub(crate) struct TestGateway<A>(pub(crate) A);

impl<A: Answers> Gateway for TestGateway<A> {
    fn login_required(&self) -> bool {
        false
    }
    fn authenticate(&self, _: String, _: String) -> GatewayFuture<'static, bool> {
        Box::pin(async { false })
    }
    fn certificate_user(&self, _: &[u8]) -> Option<String> {
        None
    }
    fn call(&self, _: &Session, version: i16, request: RequestKind) -> GatewayFuture<'static, Option<ResponseKind>> {
        self.call_internal(version, request)
    }
    fn may_configure_routing(&self, _: &Session) -> bool {
        true
    }
    fn call_internal(&self, _: i16, request: RequestKind) -> GatewayFuture<'static, Option<ResponseKind>> {
        let answer = self.0.answer(&request);
        Box::pin(async move { answer })
    }
    fn local_log_end(&self, _: &str, _: i32) -> Option<i64> {
        None
    }
    fn queue_depth(&self, _: &str, _: i32) -> GatewayFuture<'static, Option<QueueDepth>> {
        Box::pin(async { None })
    }
    fn drop_ready(&self, _: &str, _: i32, _: u64) -> GatewayFuture<'static, Option<Vec<i64>>> {
        Box::pin(async { None })
    }
    fn read_batches(&self, _: &str, _: i32, _: i64, _: usize) -> GatewayFuture<'static, Option<bytes::Bytes>> {
        Box::pin(async { None })
    }
}
