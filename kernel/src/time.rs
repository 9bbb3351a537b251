//! UTC timestamps as RFC 3339 strings (what receipts carry) and Unix milliseconds (what the store
//! indexes). The cage has its own formatter: the two crates deliberately share nothing.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in Unix milliseconds.
pub fn now_ms() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_millis() as i64).unwrap_or(0)
}

/// Unix milliseconds as RFC 3339 UTC with milliseconds.
pub fn rfc3339(ms: i64) -> String {
    let (secs, milli) = (ms.div_euclid(1000), ms.rem_euclid(1000));
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let (y, m, d) = civil_from_days(days);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}.{milli:03}Z", rem / 3600, rem % 3600 / 60, rem % 60)
}

/// Parse `YYYY-MM-DDTHH:MM:SS[.fff]Z` (UTC only) into Unix milliseconds.
pub fn parse_rfc3339(s: &str) -> Option<i64> {
    let b = s.as_bytes();
    if b.len() < 20
        || b[4] != b'-'
        || b[7] != b'-'
        || b[10] != b'T'
        || b[13] != b':'
        || b[16] != b':'
        || !s.ends_with('Z')
    {
        return None;
    }
    let num = |r: std::ops::Range<usize>| s.get(r)?.parse::<i64>().ok();
    let (y, mo, d, h, mi, se) = (num(0..4)?, num(5..7)?, num(8..10)?, num(11..13)?, num(14..16)?, num(17..19)?);
    if !(1..=12).contains(&mo) || !(1..=31).contains(&d) || h > 23 || mi > 59 || se > 60 {
        return None;
    }
    let frac = &s[19..s.len() - 1];
    let milli = match frac {
        "" => 0,
        f if f.starts_with('.') && f.len() > 1 && f[1..].bytes().all(|c| c.is_ascii_digit()) => {
            format!("{:0<3}", &f[1..f.len().min(4)]).parse::<i64>().ok()?
        }
        _ => return None,
    };
    let days = days_from_civil(y, mo as u32, d as u32);
    Some(((days * 86_400) + h * 3600 + mi * 60 + se) * 1000 + milli)
}

fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + i64::from(m <= 2), m, d)
}

fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = i64::from((m + 9) % 12);
    let doy = (153 * mp + 2) / 5 + i64::from(d) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        for ms in [0i64, 951_782_400_123, 1_795_910_400_000, 4_102_444_799_999] {
            assert_eq!(parse_rfc3339(&rfc3339(ms)), Some(ms), "{}", rfc3339(ms));
        }
        assert_eq!(rfc3339(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(parse_rfc3339("2026-11-29T12:00:00Z"), parse_rfc3339("2026-11-29T12:00:00.000Z"));
        assert_eq!(parse_rfc3339("2026-11-29 12:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-13-29T12:00:00Z"), None);
        assert_eq!(parse_rfc3339("2026-11-29T12:00:00+01:00"), None);
    }

    /// Every day from 1600 to 2400 against a plain calendar counter (Gregorian leap years).
    #[test]
    fn every_day_of_eight_centuries_is_the_calendar_s() {
        let leap = |y: i64| (y % 4 == 0 && y % 100 != 0) || y % 400 == 0;
        let month_len = |y: i64, m: u32| match m {
            2 if leap(y) => 29,
            2 => 28,
            4 | 6 | 9 | 11 => 30,
            _ => 31,
        };
        let (mut y, mut m, mut d) = (1600i64, 1u32, 1u32);
        let mut days = days_from_civil(1600, 1, 1);
        assert_eq!(days, -135_140, "1600-01-01 is 135,140 days before the epoch");
        while y <= 2400 {
            assert_eq!(civil_from_days(days), (y, m, d), "day {days}");
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
            (days, d) = (days + 1, d + 1);
            if d > month_len(y, m) {
                (d, m) = (1, m + 1);
            }
            if m > 12 {
                (m, y) = (1, y + 1);
            }
        }
        assert_eq!(rfc3339(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(rfc3339(951_825_599_999), "2000-02-29T11:59:59.999Z");
    }

    #[test]
    fn only_the_exact_utc_form_parses() {
        let at = |s: &str| parse_rfc3339(s);
        assert_eq!(at("2026-11-29T23:59:60Z"), Some(1_795_996_800_000), "a leap second");
        assert_eq!(at("2026-11-29T12:00:00.5Z"), Some(1_795_953_600_500));
        assert_eq!(at("2026-11-29T12:00:00.123456Z"), Some(1_795_953_600_123));
        assert!(now_ms() > 1_795_953_600_000, "now is after this code was written");
        for bad in [
            "2026-11-29T12:00:0Z",
            "2026/11-29T12:00:00Z",
            "2026-11/29T12:00:00Z",
            "2026-11-29T12-00:00Z",
            "2026-11-29T12:00-00Z",
            "2026-11-29T12:00:00",
            "2026-00-29T12:00:00Z",
            "2026-11-00T12:00:00Z",
            "2026-11-32T12:00:00Z",
            "2026-11-29T24:00:00Z",
            "2026-11-29T12:60:00Z",
            "2026-11-29T12:00:61Z",
            "2026-11-29T12:00:00.Z",
            "2026-11-29T12:00:00.1aZ",
            "2026-11-29T12:00:00,5Z",
        ] {
            assert_eq!(at(bad), None, "{bad}");
        }
    }
}
