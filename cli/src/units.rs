//! Parsing of sizes ("512M"), durations ("30s") and CPU amounts ("1.5") on the command line.

/// Parse a byte size: a number with an optional K/M/G/T suffix (powers of 1024), case-insensitive,
/// optionally followed by "B" or "iB".
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let t = t.strip_suffix("iB").or_else(|| t.strip_suffix("ib")).or_else(|| t.strip_suffix(['B', 'b'])).unwrap_or(t);
    let (num, mult) = match t.chars().last().map(|c| c.to_ascii_lowercase()) {
        Some('k') => (&t[..t.len() - 1], 1u64 << 10),
        Some('m') => (&t[..t.len() - 1], 1 << 20),
        Some('g') => (&t[..t.len() - 1], 1 << 30),
        Some('t') => (&t[..t.len() - 1], 1 << 40),
        _ => (t, 1),
    };
    let n: u64 = num.trim().parse().map_err(|_| format!("{s:?} is not a size (examples: 4096, 64K, 512M, 2G)"))?;
    n.checked_mul(mult).ok_or_else(|| format!("{s:?} is too large"))
}

/// Parse a duration into milliseconds: "250ms", "30s", "5m", "1h", or a plain number of seconds.
pub fn parse_duration_ms(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let bad = || format!("{s:?} is not a duration (examples: 30, 30s, 1500ms, 5m)");
    let (num, mult) = if let Some(n) = t.strip_suffix("ms") {
        (n, 1)
    } else if let Some(n) = t.strip_suffix('s') {
        (n, 1000)
    } else if let Some(n) = t.strip_suffix('m') {
        (n, 60_000)
    } else if let Some(n) = t.strip_suffix('h') {
        (n, 3_600_000)
    } else {
        (t, 1000)
    };
    let n: u64 = num.trim().parse().map_err(|_| bad())?;
    match n.checked_mul(mult) {
        Some(0) | None => Err(bad()),
        Some(v) => Ok(v),
    }
}

/// Parse a CPU amount ("1", "0.5", "2.25") into thousandths of a CPU.
pub fn parse_cpus(s: &str) -> Result<u64, String> {
    let bad = || format!("{s:?} is not a CPU amount (examples: 1, 0.5, 2)");
    let v: f64 = s.trim().parse().map_err(|_| bad())?;
    if !(0.001..=1024.0).contains(&v) {
        return Err(bad());
    }
    Ok((v * 1000.0).round() as u64)
}

/// clap value checkers: a malformed value is a usage error (exit 2) with a message about the
/// value, like every other flag clap parses; the value itself is kept as given.
pub mod arg {
    fn none_or(s: &str, check: impl Fn(&str) -> Result<u64, String>) -> Result<String, String> {
        if s.eq_ignore_ascii_case("none") {
            return Ok(s.to_string());
        }
        check(s).map(|_| s.to_string())
    }

    /// A size ("512M").
    pub fn size(s: &str) -> Result<String, String> {
        super::parse_size(s).map(|_| s.to_string())
    }

    /// A size, or "none".
    pub fn size_or_none(s: &str) -> Result<String, String> {
        none_or(s, super::parse_size)
    }

    /// A count, or "none".
    pub fn count_or_none(s: &str) -> Result<String, String> {
        none_or(s, |s| s.parse::<u64>().map_err(|_| format!("{s:?} is not a whole number")))
    }

    /// A CPU amount, or "none".
    pub fn cpus_or_none(s: &str) -> Result<String, String> {
        none_or(s, super::parse_cpus)
    }

    /// A duration.
    pub fn duration(s: &str) -> Result<String, String> {
        super::parse_duration_ms(s).map(|_| s.to_string())
    }

    /// An environment entry: KEY=VALUE, or KEY that chio's own environment has.
    pub fn env(s: &str) -> Result<String, String> {
        match s.split_once('=') {
            Some(("", _)) => Err(format!("{s:?} has no variable name")),
            Some(_) => Ok(s.to_string()),
            None if std::env::var_os(s).is_some() => Ok(s.to_string()),
            None => Err(format!("{s:?} passes chio's own value through, but it is not set (give {s}=VALUE)")),
        }
    }

    /// A bind, SRC:DST with an absolute DST.
    pub fn bind(s: &str) -> Result<String, String> {
        match s.split_once(':') {
            Some((src, dst)) if !src.is_empty() && dst.starts_with('/') => Ok(s.to_string()),
            _ => Err(format!("{s:?} is not SRC:DST (a host path, a colon, an absolute path in the cage)")),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("64K"), Ok(65536));
        assert_eq!(parse_size("512M"), Ok(512 << 20));
        assert_eq!(parse_size("2GiB"), Ok(2 << 30));
        assert_eq!(parse_size("1mb"), Ok(1 << 20));
        assert!(parse_size("lots").is_err());
        assert!(parse_size("-1M").is_err());
    }

    #[test]
    fn durations() {
        assert_eq!(parse_duration_ms("30"), Ok(30_000));
        assert_eq!(parse_duration_ms("1500ms"), Ok(1500));
        assert_eq!(parse_duration_ms("5m"), Ok(300_000));
        assert!(parse_duration_ms("0").is_err());
        assert!(parse_duration_ms("soon").is_err());
    }

    #[test]
    fn cpus() {
        assert_eq!(parse_cpus("1"), Ok(1000));
        assert_eq!(parse_cpus("0.5"), Ok(500));
        assert!(parse_cpus("0").is_err());
        assert!(parse_cpus("x").is_err());
    }
}
