//! RFC 8785 JSON Canonicalization Scheme (JCS): the bytes every signature covers.
//!
//! Serialization sorts object keys by UTF-16 code units, escapes strings the way ECMAScript's
//! `JSON.stringify` does, and prints numbers with ECMAScript's Number-to-String rules. The strict
//! parser refuses duplicate keys and lone surrogates, and [`parse_canonical`] also refuses input
//! that is not already in canonical form, so one document has exactly one signed byte string.

use std::fmt::Write;

use serde::de::{self, Deserialize, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Number, Value};

/// Largest integer magnitude an IEEE double holds exactly (2^53 - 1).
pub const MAX_SAFE_INTEGER: u64 = (1 << 53) - 1;

/// Why a document cannot be canonicalized or was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum CanonError {
    /// A number that JSON-in-ECMAScript cannot represent exactly (or NaN/Infinity).
    Number(String),
    /// Not JSON, or JSON we refuse (duplicate keys, lone surrogates, trailing data).
    Parse(String),
    /// Valid JSON, but not byte-for-byte canonical.
    NotCanonical,
}

impl std::fmt::Display for CanonError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CanonError::Number(n) => write!(f, "number {n} has no exact canonical form"),
            CanonError::Parse(e) => write!(f, "invalid JSON: {e}"),
            CanonError::NotCanonical => write!(f, "JSON is not in RFC 8785 canonical form"),
        }
    }
}

impl std::error::Error for CanonError {}

/// Canonical bytes of `v`.
pub fn to_canonical(v: &Value) -> Result<String, CanonError> {
    let mut out = String::new();
    write_value(&mut out, v)?;
    Ok(out)
}

fn write_value(out: &mut String, v: &Value) -> Result<(), CanonError> {
    match v {
        Value::Null => out.push_str("null"),
        Value::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
        Value::Number(n) => out.push_str(&number(n)?),
        Value::String(s) => write_string(out, s),
        Value::Array(items) => {
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_value(out, item)?;
            }
            out.push(']');
        }
        Value::Object(map) => {
            let mut keys: Vec<(&String, Vec<u16>)> = map.keys().map(|k| (k, k.encode_utf16().collect())).collect();
            keys.sort_by(|a, b| a.1.cmp(&b.1));
            out.push('{');
            for (i, (k, _)) in keys.iter().enumerate() {
                if i > 0 {
                    out.push(',');
                }
                write_string(out, k);
                out.push(':');
                write_value(out, &map[k.as_str()])?;
            }
            out.push('}');
        }
    }
    Ok(())
}

/// Escape as ECMAScript `JSON.stringify` does: only `"`, `\` and control characters.
fn write_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// JCS treats every number as an IEEE double. An integer is accepted only when that reading
/// changes nothing: its double prints as exactly the same digits. Anything else (2^53 + 1, or
/// 2^60 which would print as 1152921504606847000) is refused rather than silently altered.
fn number(n: &Number) -> Result<String, CanonError> {
    let exact = |digits: String, as_f64: f64| -> Result<String, CanonError> {
        if format_f64(as_f64)? == digits {
            Ok(digits)
        } else {
            Err(CanonError::Number(digits))
        }
    };
    if let Some(u) = n.as_u64() {
        return exact(u.to_string(), u as f64);
    }
    if let Some(i) = n.as_i64() {
        return exact(i.to_string(), i as f64);
    }
    n.as_f64().ok_or_else(|| CanonError::Number(n.to_string())).and_then(format_f64)
}

/// ECMAScript Number-to-String of a double (RFC 8785 §3.2.2.3).
pub fn format_f64(f: f64) -> Result<String, CanonError> {
    if !f.is_finite() {
        return Err(CanonError::Number(f.to_string()));
    }
    if f == 0.0 {
        return Ok("0".into());
    }
    // Shortest round-trip digits with ECMAScript's tie-breaking and layout (ryu-js).
    Ok(ryu_js::Buffer::new().format_finite(f).to_string())
}

/// A JSON value parsed with duplicate keys refused.
struct Strict(Value);

impl<'de> Deserialize<'de> for Strict {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(StrictVisitor)
    }
}

struct StrictVisitor;

impl<'de> Visitor<'de> for StrictVisitor {
    type Value = Strict;

    fn expecting(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_unit<E>(self) -> Result<Strict, E> {
        Ok(Strict(Value::Null))
    }
    fn visit_bool<E>(self, b: bool) -> Result<Strict, E> {
        Ok(Strict(Value::Bool(b)))
    }
    fn visit_i64<E>(self, i: i64) -> Result<Strict, E> {
        Ok(Strict(Value::Number(i.into())))
    }
    fn visit_u64<E>(self, u: u64) -> Result<Strict, E> {
        Ok(Strict(Value::Number(u.into())))
    }
    fn visit_f64<E: de::Error>(self, f: f64) -> Result<Strict, E> {
        Number::from_f64(f).map(|n| Strict(Value::Number(n))).ok_or_else(|| E::custom("non-finite number"))
    }
    fn visit_str<E>(self, s: &str) -> Result<Strict, E> {
        Ok(Strict(Value::String(s.to_owned())))
    }
    fn visit_string<E>(self, s: String) -> Result<Strict, E> {
        Ok(Strict(Value::String(s)))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Strict, A::Error> {
        let mut items = Vec::new();
        while let Some(Strict(v)) = seq.next_element()? {
            items.push(v);
        }
        Ok(Strict(Value::Array(items)))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Strict, A::Error> {
        let mut out = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            if out.contains_key(&key) {
                return Err(de::Error::custom(format!("duplicate key {key:?}")));
            }
            let Strict(v) = map.next_value()?;
            out.insert(key, v);
        }
        Ok(Strict(Value::Object(out)))
    }
}

/// The first integer token (no fraction, no exponent) outside the 64-bit range that a double
/// cannot hold exactly, if any: it would otherwise be parsed as a double and silently rounded.
fn oversized_integer(bytes: &[u8]) -> Option<String> {
    let mut i = 0;
    while i < bytes.len() {
        match bytes[i] {
            b'"' => {
                // Skip the string, escapes included.
                i += 1;
                while i < bytes.len() && bytes[i] != b'"' {
                    i += if bytes[i] == b'\\' { 2 } else { 1 };
                }
                i += 1;
            }
            b'-' | b'0'..=b'9' => {
                let start = i;
                i += 1;
                while i < bytes.len() && matches!(bytes[i], b'0'..=b'9' | b'.' | b'e' | b'E' | b'+' | b'-') {
                    i += 1;
                }
                let tok = std::str::from_utf8(&bytes[start..i]).unwrap_or("");
                let integer = !tok.contains(['.', 'e', 'E']);
                // Beyond i64/u64 a number is a double: fine when the double prints back as
                // exactly these digits (RFC 8785 writes doubles below 1e21 without exponent),
                // refused when it was rounded.
                let exact = |t: &str| t.parse::<f64>().ok().and_then(|f| format_f64(f).ok()).is_some_and(|c| c == t);
                if integer && tok.parse::<i64>().is_err() && tok.parse::<u64>().is_err() && !exact(tok) {
                    return Some(tok.to_string());
                }
            }
            _ => i += 1,
        }
    }
    None
}

/// Parse JSON, refusing duplicate keys, lone surrogates, non-finite numbers and integers
/// beyond the 64-bit range (which would be rounded).
pub fn parse_strict(bytes: &[u8]) -> Result<Value, CanonError> {
    if let Some(tok) = oversized_integer(bytes) {
        return Err(CanonError::Parse(format!("integer {tok} is beyond the 64-bit range and would be rounded")));
    }
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let Strict(v) = Strict::deserialize(&mut de).map_err(|e| CanonError::Parse(e.to_string()))?;
    de.end().map_err(|e| CanonError::Parse(e.to_string()))?;
    Ok(v)
}

/// Parse JSON that must already be canonical (what a signature covers).
pub fn parse_canonical(bytes: &[u8]) -> Result<Value, CanonError> {
    let v = parse_strict(bytes)?;
    if to_canonical(&v)?.as_bytes() != bytes {
        return Err(CanonError::NotCanonical);
    }
    Ok(v)
}

/// An integer field that must be exactly representable (0 ..= 2^53 - 1).
pub fn exact_u64(v: &Value) -> Option<u64> {
    v.as_u64().filter(|u| *u <= MAX_SAFE_INTEGER)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn canon(text: &str) -> String {
        to_canonical(&parse_strict(text.as_bytes()).unwrap()).unwrap()
    }

    #[test]
    fn rfc8785_main_example() {
        let input = r#"{
          "numbers": [333333333.33333329, 1E30, 4.50, 2e-3, 0.000000000000000000000000001],
          "string": "\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/",
          "literals": [null, true, false]
        }"#;
        assert_eq!(
            canon(input),
            "{\"literals\":[null,true,false],\"numbers\":[333333333.3333333,1e+30,4.5,0.002,1e-27],\
             \"string\":\"\u{20ac}$\\u000f\\nA'B\\\"\\\\\\\\\\\"/\"}"
        );
    }

    #[test]
    fn rfc8785_sorting_by_utf16() {
        let input = r#"{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh",
          "1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}"#;
        let out = canon(input);
        let order = ["\\r", "1", "\u{80}", "\u{f6}", "\u{20ac}", "\u{1f600}", "\u{fb33}"];
        let positions: Vec<usize> = order.iter().map(|k| out.find(&format!("\"{k}\"")).unwrap()).collect();
        assert!(positions.windows(2).all(|w| w[0] < w[1]), "{out}");
    }

    #[test]
    fn rfc8785_number_vectors() {
        let vectors: [(u64, &str); 26] = [
            (0x0000000000000000, "0"),
            (0x8000000000000000, "0"),
            (0x0000000000000001, "5e-324"),
            (0x8000000000000001, "-5e-324"),
            (0x7fefffffffffffff, "1.7976931348623157e+308"),
            (0xffefffffffffffff, "-1.7976931348623157e+308"),
            (0x4340000000000000, "9007199254740992"),
            (0xc340000000000000, "-9007199254740992"),
            (0x4430000000000000, "295147905179352830000"),
            (0x44b52d02c7e14af5, "9.999999999999997e+22"),
            (0x44b52d02c7e14af6, "1e+23"),
            (0x44b52d02c7e14af7, "1.0000000000000001e+23"),
            (0x444b1ae4d6e2ef4e, "999999999999999700000"),
            (0x444b1ae4d6e2ef4f, "999999999999999900000"),
            (0x444b1ae4d6e2ef50, "1e+21"),
            (0x3eb0c6f7a0b5ed8c, "9.999999999999997e-7"),
            (0x3eb0c6f7a0b5ed8d, "0.000001"),
            (0x41b3de4355555553, "333333333.3333332"),
            (0x41b3de4355555554, "333333333.33333325"),
            (0x41b3de4355555555, "333333333.3333333"),
            (0x41b3de4355555556, "333333333.3333334"),
            (0x41b3de4355555557, "333333333.33333343"),
            (0xbecbf647612f3696, "-0.0000033333333333333333"),
            (0x43143ff3c1cb0959, "1424953923781206.2"),
            (0x3ff0000000000000, "1"),
            (0x3fe0000000000000, "0.5"),
        ];
        for (bits, want) in vectors {
            assert_eq!(format_f64(f64::from_bits(bits)).unwrap(), want, "bits {bits:#018x}");
        }
        assert!(matches!(format_f64(f64::NAN), Err(CanonError::Number(_))));
        assert!(matches!(format_f64(f64::INFINITY), Err(CanonError::Number(_))));
    }

    #[test]
    fn strict_parser_refusals() {
        assert!(matches!(parse_strict(br#"{"a":1,"a":2}"#), Err(CanonError::Parse(e)) if e.contains("duplicate")));
        assert!(matches!(parse_strict(br#"{"x":{"a":1,"a":1}}"#), Err(CanonError::Parse(_))));
        for (bad, what) in [
            (&br#""\ud800""#[..], "lone high surrogate"),
            (br#""\udc00x""#, "lone low surrogate"),
            (br#"{"a":1} x"#, "trailing data"),
        ] {
            assert!(matches!(parse_strict(bad), Err(CanonError::Parse(_))), "{what}");
        }
        for big in [&b"-9223372036854775809"[..], b"18446744073709551616", br#"{"a":[1,99999999999999999999]}"#] {
            assert!(matches!(parse_strict(big), Err(CanonError::Parse(m)) if m.contains("64-bit")), "{big:?}");
        }
        assert!(parse_strict(br#"{"s":"-99999999999999999999","n":-9223372036854775808,"f":1e300}"#).is_ok());
        assert!(matches!(to_canonical(&serde_json::json!(9007199254740993u64)), Err(CanonError::Number(_))));
        assert!(matches!(to_canonical(&serde_json::json!(1u64 << 60)), Err(CanonError::Number(_))));
        assert_eq!(to_canonical(&serde_json::json!(158810220146246880u64)).unwrap(), "158810220146246880");
        assert_eq!(to_canonical(&serde_json::json!(-9007199254740992i64)).unwrap(), "-9007199254740992");
        assert_eq!(exact_u64(&serde_json::json!(9007199254740991u64)), Some(9007199254740991));
        assert_eq!(exact_u64(&serde_json::json!(9007199254740992u64)), None);
        assert_eq!(exact_u64(&serde_json::json!(1.5)), None);
    }

    #[test]
    fn only_control_characters_are_escaped() {
        // U+001F is the last escaped; space, DEL and everything above are written as they are.
        let v = Value::String("a b\u{1f}\u{7f}\u{e9}".into());
        assert_eq!(to_canonical(&v).unwrap(), "\"a b\\u001f\u{7f}\u{e9}\"");
    }

    #[test]
    fn an_unterminated_string_is_refused_not_a_panic() {
        for bad in [&b"\"abc"[..], b"\"ab\\", b"[\"a\\\"", b"{\"a"] {
            assert!(matches!(parse_strict(bad), Err(CanonError::Parse(_))), "{}", String::from_utf8_lossy(bad));
        }
    }

    #[test]
    fn canonical_input_is_required_where_demanded() {
        assert!(parse_canonical(br#"{"a":1,"b":[true,null]}"#).is_ok());
        for bad in [&br#"{"b":1,"a":2}"#[..], br#"{"a": 1}"#, br#"{"a":1.0}"#, br#"{"a":"\u0041"}"#, b"{\"a\":1}\n"] {
            assert_eq!(parse_canonical(bad), Err(CanonError::NotCanonical), "{}", String::from_utf8_lossy(bad));
        }
    }

    /// Deterministic pseudo-random JSON for the property tests (xorshift; no extra crates).
    struct Rng(u64);
    impl Rng {
        fn next(&mut self) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0
        }
        fn value(&mut self, depth: u32) -> Value {
            match self.next() % if depth > 3 { 5 } else { 7 } {
                0 => Value::Null,
                1 => Value::Bool(self.next() % 2 == 0),
                2 => serde_json::json!(self.next() % (MAX_SAFE_INTEGER + 1)),
                3 => {
                    let f = f64::from_bits(self.next());
                    if f.is_finite() {
                        serde_json::json!(f)
                    } else {
                        serde_json::json!(0.25)
                    }
                }
                4 => Value::String(self.string()),
                5 => Value::Array((0..self.next() % 4).map(|_| self.value(depth + 1)).collect()),
                _ => Value::Object((0..self.next() % 4).map(|_| (self.string(), self.value(depth + 1))).collect()),
            }
        }
        fn string(&mut self) -> String {
            let pool =
                ['a', 'Z', '"', '\\', '\n', '\u{1}', '\u{7f}', '\u{e9}', '\u{20ac}', '\u{1f600}', '\u{fb33}', ' '];
            (0..self.next() % 6).map(|_| pool[(self.next() % pool.len() as u64) as usize]).collect()
        }
    }

    #[test]
    fn property_round_trip_and_idempotence() {
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
        for _ in 0..3000 {
            let v = rng.value(0);
            let c = to_canonical(&v).unwrap();
            let back = parse_canonical(c.as_bytes()).unwrap();
            // Parsing may read an integral double back as an integer: equal as JSON numbers, and
            // the canonical bytes are identical, which is what a signature covers.
            assert_eq!(to_canonical(&back).unwrap(), c, "round trip and idempotence of {c}");
        }
    }

    #[test]
    fn property_numbers_round_trip() {
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        for _ in 0..100_000 {
            let f = f64::from_bits(rng.next());
            if f.is_finite() {
                let s = format_f64(f).unwrap();
                assert_eq!(s.parse::<f64>().unwrap(), if f == 0.0 { 0.0 } else { f }, "{s}");
            }
        }
    }
}
