//! What the daemon counts for its operator, in the Prometheus/OpenMetrics text format (encoded
//! by `prometheus-client`, served by [`super::scrape`]): launches by outcome and state,
//! refusals by reason, limit hits by kind, how long a request takes to its observed exec and
//! to its answer, how many wait for a launch slot, how many cages are alive, whether a spare
//! waits ready, and how long the store's writes take.
//!
//! Every label value comes from a closed set (a refusal's reason, a record's state, a limit's
//! kind, fixed words): nothing a client sends becomes a label, so no client can grow the
//! daemon's memory or a scrape by sending new values.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::{Registry, Unit};

use super::launcher::Gauges;

/// A launch's outcome, its record's state and its operation.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct LaunchLabels {
    op: &'static str,
    outcome: &'static str,
    state: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct KindLabels {
    kind: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OpLabels {
    op: &'static str,
}

/// The states a launch record can be in (`chio_cage::State`), as labels.
const STATES: [&str; 5] = ["FullyEnforced", "NotConfined", "BootstrapFailed", "Rejected", "Unsupported"];
/// The ceilings a launch can hit (`chio_cage::Outcome::limit_hit`), as labels.
const LIMITS: [&str; 5] = ["wall_time", "memory", "pids", "output", "cpu"];

/// Why a request was refused: the word in its answer's `reason` and in
/// `chio_refusals_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Reason {
    /// The daemon serves its `max_connections`.
    Connections,
    /// The peer's uid and gid map to no role.
    NotAClient,
    /// The peer's uid has its `max_connections_per_client` open.
    ClientConnections,
    /// The request could not be read or parsed, or names what it may not.
    BadRequest,
    /// No complete request within `request_timeout_s`.
    RequestTimeout,
    /// The peer's role may not ask this.
    Role,
    /// The peer's uid has its `max_launches_per_client` running.
    ClientLaunches,
    /// The daemon is stopping.
    Stopping,
    /// The request's id was used for another request.
    IdReused,
    /// A request with the id is running.
    IdRunning,
    /// A request with the id was dispatched before a stop and its outcome is unknown.
    OutcomeUnknown,
    /// The request journal could not be written.
    Journal,
    /// The launch process refused the request under the daemon's configuration (policy
    /// signers, the role's limits, its workspaces).
    NotAdmitted,
    /// The client's descriptors cannot be taken (one that could stall the launch).
    ClientDescriptors,
    /// The launch could not be started or ended without an answer.
    LaunchFailed,
}

impl Reason {
    /// Every reason, in order (the metric's label values).
    pub const ALL: [Reason; 15] = [
        Reason::Connections,
        Reason::NotAClient,
        Reason::ClientConnections,
        Reason::BadRequest,
        Reason::RequestTimeout,
        Reason::Role,
        Reason::ClientLaunches,
        Reason::Stopping,
        Reason::IdReused,
        Reason::IdRunning,
        Reason::OutcomeUnknown,
        Reason::Journal,
        Reason::NotAdmitted,
        Reason::ClientDescriptors,
        Reason::LaunchFailed,
    ];

    /// The reason's word.
    pub fn word(self) -> &'static str {
        match self {
            Reason::Connections => "connections",
            Reason::NotAClient => "not_a_client",
            Reason::ClientConnections => "client_connections",
            Reason::BadRequest => "bad_request",
            Reason::RequestTimeout => "request_timeout",
            Reason::Role => "role",
            Reason::ClientLaunches => "client_launches",
            Reason::Stopping => "stopping",
            Reason::IdReused => "id_reused",
            Reason::IdRunning => "id_running",
            Reason::OutcomeUnknown => "outcome_unknown",
            Reason::Journal => "journal",
            Reason::NotAdmitted => "not_admitted",
            Reason::ClientDescriptors => "client_descriptors",
            Reason::LaunchFailed => "launch_failed",
        }
    }

    /// The reason named `word` (an answer's `reason`); an unknown word is a failed launch.
    pub fn of(word: &str) -> Reason {
        Reason::ALL.into_iter().find(|r| r.word() == word).unwrap_or(Reason::LaunchFailed)
    }
}

/// How a dispatched request ended, as the daemon read its answer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome<'a> {
    /// The target (or the repository operation) ran and its end was reported.
    Ran {
        /// The record's state (None for a repository operation).
        state: Option<&'a str>,
        /// The ceilings it hit.
        limits: &'a [String],
    },
    /// It ended without running its target: the cage failed or refused it, or its policy did.
    NotRun {
        /// The record's state (None: no record, its policy refused it).
        state: Option<&'a str>,
    },
    /// The launch process refused it.
    Refused(Reason),
    /// It ended without an answer (or while answering).
    Unknown,
}

impl Outcome<'_> {
    /// The outcome's word (the `outcome` label, and the log's `CHIO_OUTCOME`).
    pub fn word(&self) -> &'static str {
        match self {
            Outcome::Ran { .. } => "ran",
            Outcome::NotRun { .. } => "not_run",
            Outcome::Refused(_) => "refused",
            Outcome::Unknown => "unknown",
        }
    }
}

/// The daemon's metrics.
pub struct Metrics {
    registry: Registry,
    launches: Family<LaunchLabels, Counter>,
    refusals: Family<ReasonLabels, Counter>,
    limit_hits: Family<KindLabels, Counter>,
    to_exec: Histogram,
    to_answer: Histogram,
    queued: Gauge,
    live: Gauge,
    spare_ready: Gauge,
    store_writes: Family<OpLabels, Histogram>,
}

/// Request latencies: 0.5 ms to about 16 s.
fn latency_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Store writes: 50 µs to about 1.6 s.
fn write_buckets() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 16))
}

impl Default for Metrics {
    /// Every metric registered, each labelled series of a closed set present at zero (a rate
    /// over a counter that appears only at its first increment misses that increment).
    fn default() -> Metrics {
        let mut registry = Registry::with_prefix("chio");
        let launches = Family::<LaunchLabels, Counter>::default();
        let refusals = Family::<ReasonLabels, Counter>::default();
        let limit_hits = Family::<KindLabels, Counter>::default();
        let store_writes = Family::<OpLabels, Histogram>::new_with_constructor(write_buckets as fn() -> Histogram);
        let (to_exec, to_answer) = (latency_buckets(), latency_buckets());
        let (queued, live, spare_ready) = (Gauge::default(), Gauge::default(), Gauge::default());
        for reason in Reason::ALL {
            let _ = refusals.get_or_create(&ReasonLabels { reason: reason.word() });
        }
        for kind in LIMITS {
            let _ = limit_hits.get_or_create(&KindLabels { kind });
        }
        for state in STATES {
            let _ = launches.get_or_create(&LaunchLabels { op: "launch", outcome: "ran", state });
        }
        registry.register(
            "launches",
            "Launches and repository operations the daemon dispatched, by how they ended (ran, not_run, refused, \
             unknown) and their record's state",
            launches.clone(),
        );
        registry.register(
            "refusals",
            "Requests refused, by reason (the reason word of the refusal's answer)",
            refusals.clone(),
        );
        registry.register("limit_hits", "Launches that hit a ceiling, by the ceiling's kind", limit_hits.clone());
        registry.register_with_unit(
            "launch_exec_observed",
            "From a launch request's arrival to its target's exec, observed at the exec stop",
            Unit::Seconds,
            to_exec.clone(),
        );
        registry.register_with_unit(
            "launch_answer",
            "From a launch or repository request's arrival to its answer being with its client",
            Unit::Seconds,
            to_answer.clone(),
        );
        registry.register("launch_queue_depth", "Launch requests waiting for a launch slot", queued.clone());
        registry.register(
            "live_cages",
            "Launch processes alive: running a launch or tearing its cage down",
            live.clone(),
        );
        registry.register(
            "spare_ready",
            "1 when the next launch's process waits with its work made ahead (namespace, cgroup, root, init)",
            spare_ready.clone(),
        );
        registry.register_with_unit(
            "store_write",
            "Writes to the daemon's store: its request journal (journal_begin, journal_complete, journal_unknown, \
             journal_prune) and its launches' receipts (receipt)",
            Unit::Seconds,
            store_writes.clone(),
        );
        Metrics {
            registry,
            launches,
            refusals,
            limit_hits,
            to_exec,
            to_answer,
            queued,
            live,
            spare_ready,
            store_writes,
        }
    }
}

impl Metrics {
    /// A request refused for `reason`.
    pub fn refused(&self, reason: Reason) {
        self.refusals.get_or_create(&ReasonLabels { reason: reason.word() }).inc();
    }

    /// A dispatched request (a launch when `launch`, else a repository operation) ended as
    /// `outcome`.
    pub fn ended(&self, launch: bool, outcome: Outcome<'_>) {
        let op = if launch { "launch" } else { "repository" };
        let state = |s: Option<&str>| s.and_then(|s| STATES.into_iter().find(|k| *k == s)).unwrap_or("none");
        let state = match outcome {
            Outcome::Ran { state: s, limits } => {
                for hit in limits {
                    let kind = LIMITS.into_iter().find(|k| k == hit).unwrap_or("other");
                    self.limit_hits.get_or_create(&KindLabels { kind }).inc();
                }
                state(s)
            }
            Outcome::NotRun { state: s } => state(s),
            Outcome::Refused(reason) => {
                self.refused(reason);
                "none"
            }
            Outcome::Unknown => "none",
        };
        self.launches.get_or_create(&LaunchLabels { op, outcome: outcome.word(), state }).inc();
    }

    /// A launch's target was observed at its exec `seconds` after its request arrived.
    pub fn exec_observed(&self, seconds: f64) {
        self.to_exec.observe(seconds);
    }

    /// A request's answer reached its client `seconds` after it arrived.
    pub fn answered(&self, seconds: f64) {
        self.to_answer.observe(seconds);
    }

    /// A write to the store (`op`) took `seconds`.
    pub fn store_write(&self, op: &'static str, seconds: f64) {
        self.store_writes.get_or_create(&OpLabels { op }).observe(seconds);
    }

    /// One more launch request waits for its slot; it stops waiting when the guard drops.
    pub fn queued(&self) -> Queued<'_> {
        self.queued.inc();
        Queued(&self.queued)
    }

    /// The exposition: the launcher's gauges read now, then every metric, ending `# EOF`.
    pub fn encode(&self, gauges: &Gauges) -> Result<String, std::fmt::Error> {
        let (live, ready) = gauges.read();
        self.live.set(i64::try_from(live).unwrap_or(i64::MAX));
        self.spare_ready.set(i64::from(ready));
        let mut text = String::with_capacity(8 << 10);
        prometheus_client::encoding::text::encode(&mut text, &self.registry)?;
        Ok(text)
    }
}

/// A launch request waiting for its slot (see [`Metrics::queued`]).
pub struct Queued<'a>(&'a Gauge);

impl Drop for Queued<'_> {
    fn drop(&mut self) {
        self.0.dec();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each reason's word names it back; a word no reason has is a failed launch.
    #[test]
    fn reasons_round_trip_through_their_words() {
        for r in Reason::ALL {
            assert_eq!(Reason::of(r.word()), r);
        }
        assert_eq!(Reason::of("surprise"), Reason::LaunchFailed);
        let words: std::collections::BTreeSet<_> = Reason::ALL.iter().map(|r| r.word()).collect();
        assert_eq!(words.len(), Reason::ALL.len(), "each reason has its own word");
    }

    /// Nothing outside the closed sets becomes a label: an unknown state is "none", an unknown
    /// ceiling "other".
    #[test]
    fn labels_come_from_closed_sets() {
        let m = Metrics::default();
        let limits = ["memory".to_string(), "x\"}\n# EOF".to_string()];
        m.ended(true, Outcome::Ran { state: Some("FullyEnforced"), limits: &limits });
        m.ended(true, Outcome::NotRun { state: Some("made up") });
        m.ended(false, Outcome::Refused(Reason::NotAdmitted));
        let gauges = Gauges::new().unwrap();
        let text = m.encode(&gauges).unwrap();
        assert!(text.contains(r#"chio_limit_hits_total{kind="memory"} 1"#), "{text}");
        assert!(text.contains(r#"chio_limit_hits_total{kind="other"} 1"#), "{text}");
        assert!(text.contains(r#"chio_launches_total{op="launch",outcome="not_run",state="none"} 1"#), "{text}");
        assert!(text.contains(r#"chio_launches_total{op="launch",outcome="ran",state="FullyEnforced"} 1"#), "{text}");
        assert!(text.contains(r#"chio_refusals_total{reason="not_admitted"} 1"#), "{text}");
        assert!(!text.contains("made up") && !text.contains("x\\\""), "{text}");
        assert!(text.ends_with("# EOF\n"), "{text}");
    }
}
