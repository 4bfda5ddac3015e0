//! Progress passes, worker threads and callback dispatch (in progress).

use super::settings::MsgrSettings;
use super::types::*;
use crate::config::Config;
use crate::error::Result;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

pub(crate) struct Core {
    settings: MsgrSettings,
}

#[allow(unused_variables)]
impl Core {
    pub fn new(config: &Config, dispatcher: Arc<dyn Dispatcher>) -> Result<Arc<Core>> {
        todo!()
    }
    pub fn shutdown(&self) {
        todo!()
    }
    pub fn listen(&self, addr: &str) -> Result<SocketAddr> {
        todo!()
    }
    pub fn connect(&self, addr: &str, policy: Policy) -> Result<SessionId> {
        todo!()
    }
    pub fn send(&self, s: SessionId, msg: OutMessage) -> std::result::Result<SendId, Refused> {
        todo!()
    }
    pub fn alloc_chunk(&self) -> Result<TxChunk> {
        todo!()
    }
    pub fn poll(&self, timeout: Duration) -> Result<usize> {
        todo!()
    }
    pub fn close_session(&self, s: SessionId) -> Result<()> {
        todo!()
    }
    pub fn session_info(&self, s: SessionId) -> Result<SessionInfo> {
        todo!()
    }
    pub fn sessions(&self) -> Vec<SessionId> {
        todo!()
    }
    pub fn stats(&self) -> MsgrStats {
        todo!()
    }
    pub fn settings(&self) -> &MsgrSettings {
        &self.settings
    }
    pub fn inject_fault(&self, s: SessionId, fault: Fault) -> Result<()> {
        todo!()
    }
    pub fn udp_port(&self) -> u16 {
        todo!()
    }
}
