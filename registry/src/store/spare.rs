//! Emptied buffers of written decision rows' reasons, for the next rows to fill.
//!
//! A row's `reasons` are written on the request's thread, and the row is written to
//! the store and dropped on the log thread. A fresh buffer for every row, freed on
//! another thread than the one that allocated it, cost the request threads more than
//! writing the text did. Measured with `cargo xtask bench-route` (20 paired rounds at
//! half the saturated rate, SQLite on tmpfs) and the store's writes taken out, so
//! that only the rows' making and handing over was left: the decision log cost
//! one-off requests 1.06x server CPU (95 % interval 1.02-1.10x) and 1.48x at p99
//! (0.76-2.24x) with fresh buffers, 1.02x (0.98-1.05x) and 1.04x (0.88-1.22x) with
//! buffers handed back here. With the writes, the gain is inside the runs' spread:
//! CPU 1.12x (1.03-1.17x) before, 1.10x (1.05-1.12x) and 1.18x (1.05-1.22x) in two
//! runs after, the same day; most of what is left is SQLite's work on the log thread.

use std::sync::Mutex;

/// A bounded stack of empty byte buffers with their capacity.
pub(crate) struct SpareBuffers {
    buffers: Mutex<Vec<Vec<u8>>>,
    /// Buffers kept at most; more are freed. Bounds what a burst leaves held.
    max_buffers: usize,
    /// A buffer grown beyond this (a row with unusually long reasons) is freed
    /// rather than kept for rows that need a fraction of it.
    max_capacity: usize,
    /// The capacity of a new buffer when no spare one is left.
    fresh_capacity: usize,
}

/// Buffers for decision rows' `reasons`: two full batches of the background
/// writer's, of at most 16 KiB each (a compact row of the shared catalog's takes
/// 0.2-0.6 KB).
pub(crate) static SPARE_REASONS: SpareBuffers = SpareBuffers::new(2048, 16 * 1024, 1024);

impl SpareBuffers {
    pub(crate) const fn new(
        max_buffers: usize,
        max_capacity: usize,
        fresh_capacity: usize,
    ) -> SpareBuffers {
        SpareBuffers {
            buffers: Mutex::new(Vec::new()),
            max_buffers,
            max_capacity,
            fresh_capacity,
        }
    }

    /// An empty buffer: a spare one, or a new one.
    pub(crate) fn take(&self) -> Vec<u8> {
        let spare = self
            .buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .pop();
        spare.unwrap_or_else(|| Vec::with_capacity(self.fresh_capacity))
    }

    /// Keeps `buffers`, emptied, for [`take`](Self::take). Those over the bounds are
    /// freed here, after the lock is released: a request's `take` never waits for a
    /// batch being freed.
    pub(crate) fn give_back(&self, buffers: impl IntoIterator<Item = Vec<u8>>) {
        let mut kept: Vec<Vec<u8>> = buffers
            .into_iter()
            .filter(|b| b.capacity() <= self.max_capacity)
            .map(|mut b| {
                b.clear();
                b
            })
            .collect();
        let mut spare = self
            .buffers
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        let room = self.max_buffers.saturating_sub(spare.len());
        let n = kept.len().min(room);
        spare.extend(kept.drain(..n));
        drop(spare);
        drop(kept);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_given_back_is_taken_again_empty_with_its_capacity() {
        let spare = SpareBuffers::new(4, 1024, 8);
        let mut bytes = Vec::with_capacity(300);
        bytes.extend_from_slice(b"\x01\x02");
        let at = bytes.as_ptr();
        spare.give_back([bytes]);
        let again = spare.take();
        assert!(again.is_empty());
        assert_eq!(again.as_ptr(), at);
        assert!(again.capacity() >= 300);
        // None left: a new one.
        let fresh = spare.take();
        assert_ne!(fresh.as_ptr(), at);
        assert!(fresh.capacity() >= 8 && fresh.capacity() < 300);
    }

    #[test]
    fn buffers_beyond_the_count_or_the_capacity_are_freed() {
        let spare = SpareBuffers::new(2, 1024, 8);
        spare.give_back([
            Vec::<u8>::with_capacity(2048),
            Vec::<u8>::with_capacity(100),
            Vec::<u8>::with_capacity(200),
            Vec::<u8>::with_capacity(400),
        ]);
        let kept: Vec<usize> = (0..2).map(|_| spare.take().capacity()).collect();
        assert!(kept.iter().all(|&c| (100..2048).contains(&c)), "{kept:?}");
        // The third is new: the 400 and the 2048 ones were freed.
        assert!(spare.take().capacity() < 100);
        spare.give_back([Vec::<u8>::with_capacity(50), Vec::<u8>::with_capacity(60)]);
        spare.give_back([Vec::<u8>::with_capacity(70)]);
        let caps: Vec<usize> = (0..3).map(|_| spare.take().capacity()).collect();
        assert!(caps[0] >= 50 && caps[1] >= 50 && caps[2] < 50, "{caps:?}");
    }
}
