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
    Some(from_clock_ticks(ticks))
}

/// `/proc`'s clock ticks (1/CLK_TCK of a second) as a duration.
fn from_clock_ticks(ticks: u64) -> Duration {
    let per_second = rustix::param::clock_ticks_per_second().max(1);
    Duration::from_nanos(ticks.saturating_mul(1_000_000_000) / per_second)
}

/// The share of one core the bench process burns while it has nothing to
/// do: sampled over `window` of sleep before a timed section. Every
/// figure of client CPU counts all the process's threads, so work left
/// running by an earlier section (a task never stopped, a pool's
/// housekeeping) shows up here instead of being charged to the next
/// operation unseen.
pub async fn idle_share(window: Duration) -> f64 {
    let before = CpuClock::now();
    tokio::time::sleep(window).await;
    CpuClock::now().own_since(&before).as_secs_f64() / window.as_secs_f64()
}

/// CPU time the whole machine spent busy (every core: user, nice, system,
/// irq, softirq and steal of `/proc/stat`), so that what ran beside the
/// bench during a section can be told apart from what the bench did.
#[derive(Debug, Clone, Copy)]
pub struct MachineClock {
    busy: Duration,
    process: Duration,
    at: std::time::Instant,
}

impl MachineClock {
    pub fn now() -> Option<Self> {
        let stat = std::fs::read_to_string("/proc/stat").ok()?;
        let fields: Vec<u64> =
            stat.lines().next()?.split_whitespace().skip(1).map_while(|field| field.parse().ok()).collect();
        // user nice system idle iowait irq softirq steal: all but idle and iowait.
        let ticks: u64 = [0, 1, 2, 5, 6, 7].iter().filter_map(|&i| fields.get(i)).sum();
        Some(Self { busy: from_clock_ticks(ticks), process: CpuClock::now().own, at: std::time::Instant::now() })
    }

    /// Cores kept busy by everything but the bench process since
    /// `earlier`, on average: the server answering it, and whatever else
    /// the machine ran. Clock-tick resolution, so only for sections of a
    /// second or more.
    pub fn others_since(&self, earlier: &MachineClock) -> f64 {
        let wall = self.at.duration_since(earlier.at).as_secs_f64();
        if wall <= 0.0 {
            return 0.0;
        }
        let busy = self.busy.saturating_sub(earlier.busy).as_secs_f64();
        let process = self.process.saturating_sub(earlier.process).as_secs_f64();
        (busy - process).max(0.0) / wall
    }
}

/// What the reads sections (full run and `--reads`) note, in the same words
/// so the two compare: the cores busy beside the bench since `began`.
pub fn busy_beside_note(began: Option<MachineClock>) -> Option<String> {
    let (began, ended) = (began?, MachineClock::now()?);
    Some(format!(
        "reads: beside the bench process, {:.2} cores were busy on average (the server answering it included)",
        ended.others_since(&began)
    ))
}
