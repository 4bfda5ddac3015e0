//! The soft provider: the RC engine on UDP sockets (RoCEv2 framing), with memory
//! regions, completion queues, queue pairs and a progress engine.

pub mod cq;
pub mod device;
pub mod diagnose;
pub mod mr;
pub mod mtu;
pub mod qp;
pub mod srq;
pub mod sys;
pub mod udp;
