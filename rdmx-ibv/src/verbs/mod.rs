//! Verbs objects on the soft provider (device, PD, MR, CQ, completion channel, SRQ, RC QP),
//! with libibverbs semantics, independent of libibverbs' private ABI.
