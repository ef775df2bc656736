//! The server's CPU time, from `/proc` (Linux; elsewhere nothing is measured).

/// `/proc` counts CPU time in clock ticks of 1/USER_HZ s; USER_HZ is 100 on every
/// Linux architecture that exposes it to user space.
const TICK_US: f64 = 10_000.0;

/// Name of the SQLite log thread as `/proc` shows it (cut to 15 bytes; the
/// request connection's thread is `loadout-db`).
const LOG_THREAD: &str = "loadout-sqlite";

/// CPU ticks used so far by a process, in all and by its SQLite log thread.
pub struct Usage {
    total: Option<u64>,
    /// `None` when the process's threads could not be listed.
    log_thread: Option<u64>,
}

impl Usage {
    pub fn of(pid: u32) -> Usage {
        let total = std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .ok()
            .and_then(|stat| ticks(&stat));
        let log_thread = std::fs::read_dir(format!("/proc/{pid}/task"))
            .ok()
            .map(|tasks| {
                tasks
                    .flatten()
                    .filter_map(|task| std::fs::read_to_string(task.path().join("stat")).ok())
                    .filter(|stat| thread_name(stat).is_some_and(|n| n.starts_with(LOG_THREAD)))
                    .filter_map(|stat| ticks(&stat))
                    .sum()
            });
        Usage { total, log_thread }
    }

    /// The ticks used between `before` and now.
    pub fn since(&self, before: &Usage) -> Usage {
        let since = |now: Option<u64>, then: Option<u64>| {
            now.zip(then).map(|(now, then)| now.saturating_sub(then))
        };
        Usage {
            total: since(self.total, before.total),
            log_thread: since(self.log_thread, before.log_thread),
        }
    }

    pub fn per_request(&self, requests: usize) -> PerRequest {
        let per = |ticks: u64| (requests > 0).then(|| ticks as f64 * TICK_US / requests as f64);
        PerRequest {
            total_us: self.total.and_then(per),
            log_thread_us: self.log_thread.and_then(per),
        }
    }
}

/// Server CPU microseconds per answered request.
pub struct PerRequest {
    pub total_us: Option<f64>,
    /// Of which the SQLite log thread's.
    pub log_thread_us: Option<f64>,
}

impl PerRequest {
    pub fn describe(&self) -> String {
        match (self.total_us, self.log_thread_us) {
            (Some(total), Some(log)) if log > 0.0 => {
                format!("{total:.1} us/req ({log:.1} on the log thread)")
            }
            (Some(total), _) => format!("{total:.1} us/req"),
            (None, _) => "unmeasured".into(),
        }
    }
}

/// `utime + stime` from a `stat` line. The command name may hold spaces and
/// parentheses, so fields are counted from the last `)`.
fn ticks(stat: &str) -> Option<u64> {
    let rest = &stat[stat.rfind(')')? + 1..];
    let mut fields = rest.split_whitespace();
    // After the name: state is field 3; utime and stime are fields 14 and 15.
    let utime: u64 = fields.nth(11)?.parse().ok()?;
    let stime: u64 = fields.next()?.parse().ok()?;
    Some(utime + stime)
}

fn thread_name(stat: &str) -> Option<&str> {
    Some(&stat[stat.find('(')? + 1..stat.rfind(')')?])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_are_read_after_a_name_with_spaces_and_parentheses() {
        let stat = "42 (a (b) c) S 1 42 42 0 -1 4194304 100 0 0 0 7 5 0 0 20 0 3 0";
        assert_eq!(ticks(stat), Some(12));
        assert_eq!(thread_name(stat), Some("a (b) c"));
        assert_eq!(ticks("42 (x) S 1"), None);
    }

    #[test]
    fn this_process_has_used_some_cpu() {
        // Spins until the kernel has counted a tick (10 ms) or 10 s have gone by:
        // a fixed amount of work can come in under one tick on a fast machine.
        // Opaque to the optimizer at every step: a release build would sum the
        // series in closed form and use no CPU time.
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        let mut spin = 0u64;
        let mut usage = Usage::of(std::process::id());
        while usage.total == Some(0) && std::time::Instant::now() < deadline {
            for i in 0..1_000_000u64 {
                spin = std::hint::black_box(spin.wrapping_add(i * i));
            }
            usage = Usage::of(std::process::id());
        }
        assert!(usage.total.is_some_and(|t| t > 0));
        // The threads were listed; none of a test process is the log thread.
        assert_eq!(usage.log_thread, Some(0));
    }
}
