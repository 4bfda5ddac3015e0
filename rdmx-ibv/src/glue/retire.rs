//! Destroyed objects whose event records the application has not acknowledged yet.
//!
//! Completion channel records and async events carry an object's address (the
//! `struct ibv_cq *`, `ibv_qp *`, `ibv_srq *`); libibverbs hands it to the application,
//! which reads the object through it and acknowledges (`ibv_ack_cq_events`,
//! `ibv_ack_async_event` count into the object's `*events_completed` under its mutex). With
//! a kernel, destroy purges the unread records and waits for the acks of the read ones. Our
//! records sit in pipes, which cannot be purged: freeing the object at destroy would hand
//! the application a dangling pointer and let its ack write into freed memory (heap
//! corruption; seen as a `free()` abort under Ceph). So a destroyed object whose records
//! are not all acknowledged keeps its memory (its C part intact, its rdmx part released)
//! on its context's list, and is freed once the acks catch up (checked at every destroy)
//! or when the context is closed. The list is bounded by the records a pipe holds plus the
//! events the application read and did not acknowledge.

use parking_lot::Mutex;

/// A destroyed object's memory kept for its unacknowledged records.
pub(crate) struct Retired {
    /// The object's address (its box).
    pub(crate) ptr: usize,
    /// Records written about it (final: the object is destroyed).
    pub(crate) written: u64,
    /// Reads the object's acknowledged count (under its mutex).
    pub(crate) acked: unsafe fn(usize) -> u32,
    /// Frees the object's box.
    pub(crate) free: unsafe fn(usize),
}

impl Retired {
    /// Whether every record written was acknowledged (libibverbs' counters are 32-bit and
    /// wrap).
    ///
    /// # Safety
    /// The object is still allocated.
    unsafe fn settled(&self) -> bool {
        // SAFETY: per the contract.
        let acked = unsafe { (self.acked)(self.ptr) };
        acked.wrapping_sub(self.written as u32) as i32 >= 0
    }
}

/// A context's retired objects.
#[derive(Default)]
pub(crate) struct RetiredList {
    list: Mutex<Vec<Retired>>,
}

impl RetiredList {
    /// Frees `r` now if its records are all acknowledged, else keeps it; frees the kept
    /// objects whose acks caught up meanwhile.
    ///
    /// # Safety
    /// `r` is a destroyed object of this context no one else frees, and every kept object
    /// is still allocated (only this list frees them).
    pub(crate) unsafe fn retire(&self, r: Retired) {
        let mut list = self.list.lock();
        // SAFETY: the kept objects are allocated until freed here.
        list.retain(|z| unsafe { !free_if_settled(z) });
        // SAFETY: per the contract.
        if unsafe { !free_if_settled(&r) } {
            log::debug!(
                target: "rdmx::ibv",
                "destroyed object {:#x} kept until its {} event record(s) are acknowledged ({} kept)",
                r.ptr,
                r.written,
                list.len() + 1
            );
            list.push(r);
        }
    }

    /// Objects kept.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.list.lock().len()
    }
}

impl Drop for RetiredList {
    /// The context is closed: its pipes are gone, and with them every unread record.
    fn drop(&mut self) {
        for z in self.list.get_mut().drain(..) {
            // SAFETY: kept objects are allocated and only freed here.
            unsafe { (z.free)(z.ptr) };
        }
    }
}

/// # Safety
/// `r`'s object is allocated and owned by the list.
unsafe fn free_if_settled(r: &Retired) -> bool {
    // SAFETY: per the contract.
    unsafe {
        if r.settled() {
            (r.free)(r.ptr);
            true
        } else {
            false
        }
    }
}

/// Reads `*count` under `mutex` (libibverbs' ack functions update it under that mutex).
///
/// # Safety
/// Both point into a live object whose mutex was initialised.
pub(crate) unsafe fn read_locked(mutex: *mut libc::pthread_mutex_t, count: *const u32) -> u32 {
    // SAFETY: per the contract.
    unsafe {
        libc::pthread_mutex_lock(mutex);
        let n = count.read_volatile();
        libc::pthread_mutex_unlock(mutex);
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    /// A stand-in object: a mutex and an ack counter, as libibverbs' structures have.
    #[repr(C)]
    struct Obj {
        mutex: libc::pthread_mutex_t,
        acked: u32,
    }

    static FREED: AtomicUsize = AtomicUsize::new(0);

    unsafe fn acked(p: usize) -> u32 {
        let o = p as *mut Obj;
        // SAFETY: a live Obj of the test.
        unsafe { read_locked(&raw mut (*o).mutex, &raw const (*o).acked) }
    }

    unsafe fn free(p: usize) {
        FREED.fetch_add(1, Ordering::SeqCst);
        // SAFETY: from Box::into_raw below.
        drop(unsafe { Box::from_raw(p as *mut Obj) });
    }

    fn obj() -> *mut Obj {
        Box::into_raw(Box::new(Obj {
            mutex: libc::PTHREAD_MUTEX_INITIALIZER,
            acked: 0,
        }))
    }

    #[test]
    fn kept_until_acknowledged_then_freed_at_the_next_destroy_or_close() {
        let before = FREED.load(Ordering::SeqCst);
        let list = RetiredList::default();
        let a = obj();
        let b = obj();
        let c = obj();
        let r = |p: *mut Obj, written| Retired {
            ptr: p as usize,
            written,
            acked,
            free,
        };
        // SAFETY: objects of this test, each retired once.
        unsafe {
            list.retire(r(a, 0)); // nothing written: freed at once
            assert_eq!(FREED.load(Ordering::SeqCst), before + 1);
            list.retire(r(b, 2)); // two records, none acknowledged: kept
            list.retire(r(c, 1));
            assert_eq!(list.len(), 2);
            (*b).acked = 2; // the application acknowledged both
            let d = obj();
            list.retire(r(d, 0));
            assert_eq!(list.len(), 1, "b freed when the next object was retired");
            assert_eq!(FREED.load(Ordering::SeqCst), before + 3);
        }
        drop(list); // the context closed: c goes too
        assert_eq!(FREED.load(Ordering::SeqCst), before + 4);
    }

    #[test]
    fn settles_across_the_32_bit_wrap() {
        let o = obj();
        let z = Retired {
            ptr: o as usize,
            written: u64::from(u32::MAX) + 3,
            acked,
            free,
        };
        // SAFETY: a live object of this test.
        unsafe {
            (*o).acked = u32::MAX;
            assert!(!z.settled());
            (*o).acked = 2;
            assert!(z.settled());
            // Not `free`: FREED counts the other test's objects.
            drop(Box::from_raw(o));
        }
    }
}
