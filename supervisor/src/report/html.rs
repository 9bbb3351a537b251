//! The page. maud escapes every interpolated string, so a command, path or reason written by the
//! code under audit is text, never markup; the Content-Security-Policy forbids every load
//! besides the inline style, so even markup could fetch nothing.

use maud::{html, Markup, PreEscaped, DOCTYPE};

use super::chart::{self, Series};
use super::{Call, Changes, Entry, Launch, Refusal, Report, Verification};

/// The page's policy: nothing is loaded, nothing runs, nothing is sent.
pub const CSP: &str = "default-src 'none'; style-src 'unsafe-inline'; base-uri 'none'; form-action 'none'";

const STYLE: &str = r#"
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1b1b1b; }
h1 { font-size: 1.35em; margin: 0 0 .3em; } h2 { font-size: 1.1em; margin: 1.6em 0 .5em; }
code, .mono { font-family: ui-monospace, monospace; font-size: 12px; word-break: break-all; }
#verification { padding: .8em 1em; border-radius: 6px; border: 2px solid; }
#verification.ok { background: #e7f6ea; border-color: #2e7d32; }
#verification.unsigned { background: #fff6e0; border-color: #b26a00; }
#verification.failed { background: #fdeaea; border-color: #c62828; }
#verification ul { margin: .4em 0 0; }
dl#summary { display: grid; grid-template-columns: repeat(auto-fill, minmax(150px, 1fr)); gap: .5em; }
dl#summary div { background: #f4f4f4; padding: .4em .6em; border-radius: 4px; }
dl#summary dt { font-size: 12px; color: #555; } dl#summary dd { margin: 0; font-size: 1.2em; }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; padding: .25em .5em; border-bottom: 1px solid #ddd; vertical-align: top; }
th { background: #f4f4f4; font-weight: 600; }
td.n { text-align: right; white-space: nowrap; }
tr.bad td { background: #fdeaea; } tr.denial td, tr.unreadable td { background: #fff6e0; }
.state-FullyEnforced { color: #2e7d32; font-weight: 600; } .state-other { color: #c62828; font-weight: 600; }
.limit { color: #c62828; } .fails { color: #c62828; } .holds::before { content: "✓ "; color: #2e7d32; }
.fails::before { content: "✗ "; } .source { color: #777; font-size: 12px; }
.added { color: #2e7d32; } .removed { color: #c62828; } .modified { color: #8a5a00; }
figure.chart { display: inline-block; vertical-align: top; margin: 0 1.5em 1em 0; } figure.chart figcaption { font-size: 13px; color: #444; }
svg .bar { fill: #4a78c2; } svg .axis { stroke: #888; } svg .median { stroke: #c62828; stroke-dasharray: 4 3; }
svg .label { font-size: 11px; fill: #555; }
"#;

fn mib(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

fn ms_of_us(us: u64) -> String {
    format!("{:.2} ms", us as f64 / 1000.0)
}

fn verification(v: &Verification, db: &str) -> Markup {
    let (class, headline) = match (v.holds(), &v.key) {
        (false, _) => ("failed", "NOT VERIFIED: this store does not verify"),
        (true, Some(_)) => ("ok", "Verified: every receipt is signed and the chain is intact"),
        (true, None) => ("unsigned", "Chain intact; signatures NOT checked (no --trusted-key)"),
    };
    html! {
        section #verification class=(class) {
            h1 { (headline) }
            p {
                (v.receipts) " receipt(s) in " code { (db) } ". "
                @match &v.key {
                    Some(k) => { "Each signature checked under kernel key " code.key { (k) } ". " }
                    None => { "Ids, links and sequence numbers checked; signatures were not. " }
                }
                "SQLite quick_check: " code { (v.quick_check) } ". "
                @match &v.checkpoint {
                    None => { "No checkpoint given: receipts deleted from the end would not show." }
                    Some(p) if p.is_empty() => { "The checkpoint holds: the store still ends where it said." }
                    Some(_) => { "The checkpoint does NOT hold." }
                }
            }
            @if v.all_problems().next().is_some() {
                ul.problems {
                    @for p in v.all_problems() { li { (p) } }
                }
            }
        }
    }
}

fn summary(r: &Report) -> Markup {
    let launches: Vec<&Launch> = r.launches().collect();
    let enforced = launches.iter().filter(|l| l.state == "FullyEnforced").count();
    let limit_hits =
        launches.iter().filter(|l| l.terminal.as_ref().is_some_and(|t| !t.ended.limit_hit.is_empty())).count();
    let commands = launches.iter().filter(|l| l.call.is_some()).count();
    let figures: [(&str, &str, String); 7] = [
        ("receipts", "receipts verified", r.verification.receipts.to_string()),
        ("launches", "launches in the store", r.launches_total.to_string()),
        ("shown", "launches shown", launches.len().to_string()),
        ("enforced", "FullyEnforced", enforced.to_string()),
        ("commands", "repository commands", commands.to_string()),
        ("refusals", "refusals", r.refusals.len().to_string()),
        ("limit_hits", "launches that hit a limit", limit_hits.to_string()),
    ];
    html! {
        dl #summary {
            @for (key, label, value) in &figures {
                div { dt { (label) } dd data-figure=(key) { (value) } }
            }
        }
        @if (launches.len() as u64) < r.launches_total {
            p.note { "The timeline starts at receipt " (r.from_seq) ": the newest " (launches.len()) " of "
                (r.launches_total) " launches (--last). The verification above covers the whole store." }
        }
    }
}

fn charts(r: &Report) -> Markup {
    let series = |id, title, unit, f: &dyn Fn(&Launch) -> Option<f64>| Series {
        id,
        title,
        unit,
        points: r.launches().filter_map(|l| Some((l.seq, f(l)?))).collect(),
    };
    fn ended(l: &Launch) -> Option<&chio_cage::record::Outcome> {
        l.terminal.as_ref().map(|t| &t.ended)
    }
    let all = [
        series("chart-exec", "Launch start to observed exec", "ms", &|l| Some(l.exec_observed_us? as f64 / 1000.0)),
        series("chart-wall", "Wall time from exec to end", "ms", &|l| Some(ended(l)?.wall_ms as f64)),
        series("chart-cpu", "CPU time of the cage", "ms", &|l| Some(ended(l)?.cpu_ms as f64)),
        series("chart-memory", "Peak memory of the cage", "MiB", &|l| {
            Some(ended(l)?.peak_memory_bytes as f64 / f64::from(1 << 20))
        }),
    ];
    html! {
        @for s in &all { (chart::bars(s)) }
    }
}

fn changes(c: &Changes) -> Markup {
    html! {
        @if c.is_empty() {
            p { "No file changed." }
        } @else {
            ul.changes {
                @for (p, what) in &c.added { li.added { "+ " code { (p) } " " span.source { (what) } } }
                @for (p, what) in &c.removed { li.removed { "− " code { (p) } " " span.source { (what) } } }
                @for (p, what) in &c.modified { li.modified { "~ " code { (p) } " " span.source { (what) } } }
            }
            @if c.unlisted > 0 { p { "… and " (c.unlisted) " more change(s) not listed." } }
        }
    }
}

fn call_detail(c: &Call) -> Markup {
    html! {
        p.source {
            "tool_call receipt " (c.seq) " " code { (c.id) }
            @if let Some(k) = &c.operation_key { "; operation key " code { (k) } }
            "; transition " (c.transition)
            @if let Some(r) = &c.reason { "; " (r) }
        }
        @match &c.changes {
            Some(Ok(ch)) => { h4 { "Files changed (" (ch.count()) ")" } (changes(ch)) }
            Some(Err(e)) => { p.fails { "File changes cannot be shown: " (e) } }
            None => {}
        }
    }
}

fn launch_row(l: &Launch, r: &Report) -> Markup {
    let bad = r.verification.bad.contains(&l.seq)
        || l.terminal.as_ref().is_some_and(|t| r.verification.bad.contains(&t.seq))
        || l.call.as_ref().is_some_and(|c| r.verification.bad.contains(&c.seq));
    let ended = l.terminal.as_ref().map(|t| &t.ended);
    let state_class = if l.state == "FullyEnforced" { "state state-FullyEnforced" } else { "state state-other" };
    let mut exit = match (&l.terminal, l.failure.as_ref()) {
        (Some(t), _) => t.outcome.clone(),
        (None, Some(f)) => f.code.to_string(),
        (None, None) => "—".into(),
    };
    // A command whose change was refused ended, but its change was not kept.
    if let Some(c) = l.call.as_ref().filter(|c| c.transition != "committed") {
        exit = format!("{exit}, {}", c.transition);
    }
    let limits = ended.map(|e| e.limit_hit.join(", ")).filter(|s| !s.is_empty());
    html! {
        tr.launch.bad[bad] id=(format!("r-{}", l.seq)) data-seq=(l.seq) {
            td.n.seq { (l.seq) }
            td.time { (l.issued_at) }
            td.what {
                details {
                    summary { code { (l.what()) } }
                    p.source { "launch_enforcement receipt " code.id { (l.id) }
                        @if let Some(t) = &l.terminal { "; launch_terminal receipt " (t.seq) } }
                    @if let Some(e) = &l.record_error { p.fails { "No facts: " (e) } }
                    @if let Some(f) = l.failure.as_ref() {
                        p.fails { (f.code) " at " (format!("{:?}", f.stage)) ": " (f.detail) }
                    }
                    @if !l.facts.is_empty() {
                        ul.facts {
                            @for f in &l.facts {
                                li.fact.holds[f.holds].fails[!f.holds] data-fact=(f.name) {
                                    b { (f.name) } ": " (f.value) " " span.source { "(" (f.source) ")" }
                                }
                            }
                        }
                    }
                    @if let Some(c) = &l.call { (call_detail(c)) }
                }
            }
            td class=(state_class) { (l.state) }
            td.exit { (exit) }
            td.n.exec data-value=[l.exec_observed_us] { (l.exec_observed_us.map_or_else(|| "—".into(), ms_of_us)) }
            td.n.wall data-value=[ended.map(|e| e.wall_ms)] { (ended.map_or_else(|| "—".into(), |e| format!("{} ms", e.wall_ms))) }
            td.n.cpu data-value=[ended.map(|e| e.cpu_ms)] { (ended.map_or_else(|| "—".into(), |e| format!("{} ms", e.cpu_ms))) }
            td.n.memory data-value=[ended.map(|e| e.peak_memory_bytes)] { (ended.map_or_else(|| "—".into(), |e| mib(e.peak_memory_bytes))) }
            td.limits { @if let Some(s) = &limits { span.limit { (s) } } @else { "—" } }
            td.n.changes data-value=[l.call.as_ref().and_then(|c| c.changes.as_ref()).and_then(|c| c.as_ref().ok()).map(Changes::count)] {
                @match l.call.as_ref().and_then(|c| c.changes.as_ref()) {
                    Some(Ok(c)) => { (c.count()) }
                    Some(Err(_)) => { span.fails { "unreadable" } }
                    None => { "—" }
                }
            }
        }
    }
}

fn timeline(r: &Report) -> Markup {
    html! {
        table #timeline {
            thead { tr {
                th { "receipt" } th { "issued" } th { "command (open for facts and changes)" } th { "state" }
                th { "end" } th { "to exec" } th { "wall" } th { "cpu" } th { "peak memory" } th { "limits hit" }
                th { "files changed" }
            } }
            tbody {
                @for e in &r.entries {
                    @match e {
                        Entry::Launch(l) => { (launch_row(l, r)) }
                        Entry::Call(c) => {
                            tr.call.bad[r.verification.bad.contains(&c.seq)] id=(format!("r-{}", c.seq)) data-seq=(c.seq) {
                                td.n.seq { (c.seq) } td {} td.what { details { summary { code { (c.what) } } (call_detail(c)) } }
                                td.state { (c.outcome) } td colspan="7" {}
                            }
                        }
                        Entry::Denial(seq) => {
                            tr.denial.bad[r.verification.bad.contains(seq)] id=(format!("r-{seq}")) data-seq=(seq) {
                                td.n.seq { (seq) } td {} td.what { "refused: see " a href=(format!("#refusal-{seq}")) { "Refusals" } }
                                td.state { "denied" } td colspan="7" {}
                            }
                        }
                        Entry::Unreadable(seq, why) => {
                            tr.unreadable.bad id=(format!("r-{seq}")) data-seq=(seq) {
                                td.n.seq { (seq) } td {} td.what colspan="9" { "unreadable receipt: " (why) }
                            }
                        }
                    }
                }
            }
        }
    }
}

fn refusals(list: &[Refusal]) -> Markup {
    html! {
        @if list.is_empty() {
            p #refusals { "No refusal is recorded in the receipts shown." }
        } @else {
            ul #refusals {
                @for f in list {
                    li.refusal id=(format!("refusal-{}", f.seq)) data-seq=(f.seq) {
                        b { (f.by) } " refused (" code { (f.rule) } "), receipt " (f.seq) " at " (f.issued_at)
                        ul { @for why in &f.reasons { li.reason { (why) } } }
                    }
                }
            }
        }
    }
}

/// The whole page.
pub fn render(r: &Report) -> String {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta http-equiv="Content-Security-Policy" content=(CSP);
                meta name="referrer" content="no-referrer";
                title { "chio receipt report: " (r.db) }
                style { (PreEscaped(STYLE)) }
            }
            body {
                (verification(&r.verification, &r.db))
                h2 { "Summary" }
                (summary(r))
                @if let Some(s) = &r.session { p { "File changes from the snapshots of " code { (s) } "." } }
                h2 { "Launch latency and resource use" }
                (charts(r))
                h2 { "Timeline" }
                (timeline(r))
                h2 { "Refusals" }
                (refusals(&r.refusals))
                footer { p.source { "Made by chio " (env!("CARGO_PKG_VERSION")) " at " (r.generated_at)
                    " from the store's receipts; nothing on this page is loaded from elsewhere." } }
            }
        }
    }
    .into_string()
}
