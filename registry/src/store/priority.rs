//! CPU priority of the SQLite log thread.
//!
//! The log thread writes the decision log while requests are being served on the
//! same cores. At normal priority, or even at nice 19, its work and its system calls
//! delay requests: on 2 cores at 11,800 logged requests/s, `/api/route` p99 was
//! 0.37 ms with no log, 0.8 ms writing the rows into an in-memory database at nice
//! 19, and 0.37 ms doing the same under `SCHED_IDLE`. A `SCHED_IDLE` thread runs only
//! on CPU time nobody else wants, and a core running one counts as idle when a
//! request's thread wakes up.
//!
//! The risk of `SCHED_IDLE` is starvation: at saturation the thread would never run
//! and the queue would fill until rows are dropped. So a batch the background writer
//! marks [`LogPace::CatchUp`](super::LogPace::CatchUp) (its queue is filling) is
//! written at normal priority ([`LogPriority::catch_up`]).
//! Leaving `SCHED_IDLE` needs `CAP_SYS_NICE` or a high enough `RLIMIT_NICE`; where a
//! probe shows that the way back is refused, the thread stays at nice 19 instead,
//! which can never starve completely.

/// How the log thread yields the CPU, decided once when it starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LogPriority {
    /// `SCHED_IDLE`, raised to normal while catching up.
    Idle,
    /// Nice 19 throughout (the way back from `SCHED_IDLE` is refused here).
    Nice,
    /// Normal priority (not Linux, or every change refused).
    Normal,
}

/// Niceness of the log thread where `SCHED_IDLE` cannot be left again.
const NICE: i32 = 19;

impl LogPriority {
    /// Lowers the calling thread's priority as far as it can come back from.
    pub(super) fn lower() -> LogPriority {
        #[cfg(target_os = "linux")]
        {
            if linux::can_leave_idle() && linux::set_idle().is_ok() {
                return LogPriority::Idle;
            }
            match rustix::process::setpriority_process(None, NICE) {
                Ok(()) => LogPriority::Nice,
                Err(e) => {
                    tracing::debug!("log writer thread keeps its priority: {e}");
                    LogPriority::Normal
                }
            }
        }
        #[cfg(not(target_os = "linux"))]
        LogPriority::Normal
    }

    /// Runs the calling thread at normal priority until the guard drops, if it is
    /// `SCHED_IDLE`: the writer is behind and must not wait for idle CPU time.
    pub(super) fn catch_up(self) -> CatchUp {
        #[cfg(target_os = "linux")]
        if self == LogPriority::Idle {
            return match linux::set_normal() {
                Ok(()) => CatchUp { raised: true },
                Err(e) => {
                    tracing::debug!("log writer cannot leave SCHED_IDLE to catch up: {e}");
                    CatchUp { raised: false }
                }
            };
        }
        CatchUp { raised: false }
    }
}

/// Puts the thread back under `SCHED_IDLE` when dropped.
pub(super) struct CatchUp {
    raised: bool,
}

impl Drop for CatchUp {
    fn drop(&mut self) {
        #[cfg(target_os = "linux")]
        if self.raised
            && let Err(e) = linux::set_idle()
        {
            tracing::debug!("log writer stays at normal priority: {e}");
        }
    }
}

#[cfg(target_os = "linux")]
mod linux {
    use thread_priority::{
        NormalThreadSchedulePolicy, ThreadPriority, ThreadSchedulePolicy,
        set_thread_priority_and_policy, thread_native_id,
    };

    fn set(policy: NormalThreadSchedulePolicy) -> Result<(), thread_priority::Error> {
        set_thread_priority_and_policy(
            thread_native_id(),
            // Nice 19 for SCHED_OTHER; SCHED_IDLE takes no priority.
            ThreadPriority::Min,
            ThreadSchedulePolicy::Normal(policy),
        )
    }

    pub(super) fn set_idle() -> Result<(), thread_priority::Error> {
        set(NormalThreadSchedulePolicy::Idle)
    }

    /// `SCHED_OTHER` at nice 0.
    pub(super) fn set_normal() -> Result<(), thread_priority::Error> {
        set(NormalThreadSchedulePolicy::Other)?;
        rustix::process::setpriority_process(None, 0)
            .map_err(|e| thread_priority::Error::OS(e.raw_os_error()))
    }

    /// Whether a thread of this process may go to `SCHED_IDLE` and back to nice 0:
    /// tried on a short-lived thread, so a refusal strands nobody.
    pub(super) fn can_leave_idle() -> bool {
        std::thread::Builder::new()
            .name("loadout-probe".into())
            .spawn(|| set_idle().is_ok() && set_normal().is_ok())
            .ok()
            .and_then(|probe| probe.join().ok())
            .unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lowering_and_catching_up_keep_the_thread_usable() {
        let priority = std::thread::spawn(|| {
            let priority = LogPriority::lower();
            {
                let _catch_up = priority.catch_up();
            }
            priority
        })
        .join()
        .expect("thread");
        // Linux gives at least nice 19 to anyone; elsewhere nothing changes.
        if cfg!(target_os = "linux") {
            assert_ne!(priority, LogPriority::Normal);
        }
    }
}
