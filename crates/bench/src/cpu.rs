//! CPU time spent by the client: the bench process itself (every thread,
//! `CLOCK_PROCESS_CPUTIME_ID`, nanosecond resolution) and its waited-for
//! children (pgbench: `cutime + cstime` of `/proc/self/stat`, in clock
//! ticks, so only as fine as 1/CLK_TCK, usually 10 ms).

use std::time::Duration;

use rustix::time::{ClockId, clock_gettime};

/// CPU used so far.
#[derive(Debug, Clone, Copy)]
pub struct CpuClock {
    own: Duration,
    children: Option<Duration>,
}

impl CpuClock {
    pub fn now() -> Self {
        let t = clock_gettime(ClockId::ProcessCPUTime);
        let own = Duration::new(u64::try_from(t.tv_sec).unwrap_or(0), u32::try_from(t.tv_nsec).unwrap_or(0));
        Self { own, children: children_cpu() }
    }

    /// CPU of the bench process itself since `earlier`.
    pub fn own_since(&self, earlier: &CpuClock) -> Duration {
        self.own.saturating_sub(earlier.own)
    }

    /// CPU of children that ended (and were waited for) since `earlier`.
    pub fn children_since(&self, earlier: &CpuClock) -> Option<Duration> {
        Some(self.children?.saturating_sub(earlier.children?))
    }
}

fn children_cpu() -> Option<Duration> {
    let stat = std::fs::read_to_string("/proc/self/stat").ok()?;
    // The command name may hold spaces; the fields after it do not.
    let rest = &stat[stat.rfind(')')? + 1..];
    let fields: Vec<&str> = rest.split_whitespace().collect();
    // Fields 16 (cutime) and 17 (cstime) of proc(5); `rest` starts at field 3.
    let ticks = fields.get(13)?.parse::<u64>().ok()? + fields.get(14)?.parse::<u64>().ok()?;
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Some(Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second))
}
