//! RoCEv2 packet formats (rc-transport.md §1, §2, §7).
