//! How bytes and numbers read on a page: a key or value as null, empty, text, JSON or hex
//! (never guessed past what the bytes are), or, when it is framed with the id of a schema
//! the registry knows, decoded by that schema; sizes and times in human units.
//!
//! The console knows no schema registry: the broker gives it a [`SchemaDecoder`], so the
//! console depends on no schema format and a console without a registry decodes nothing.

/// The longest text or hex shown of one key, value or header before it is cut.
pub const SHOWN_BYTES_MAX: usize = 4096;

/// A key or value decoded by the schema it names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SchemaDecoded {
    /// `avro`, `protobuf` or `json-schema`.
    pub kind: &'static str,
    pub schema_id: i32,
    /// The value as pretty JSON.
    pub json: String,
}

/// Decodes keys and values written in a schema registry's wire format (a 0 byte, the schema
/// id, the payload).
pub trait SchemaDecoder: Send + Sync {
    /// `None` when `bytes` are not so framed or name a schema it does not know (they are
    /// then shown as bytes); else the value, or why it does not decode by its schema.
    fn decode(&self, bytes: &[u8]) -> Option<Result<SchemaDecoded, String>>;
}

/// A key, value or header value as the page shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Shown {
    /// No bytes at all (a null key, a tombstone).
    Null,
    /// Zero bytes.
    Empty,
    /// UTF-8 text that is not JSON.
    Text(String),
    /// A JSON object or array, pretty-printed.
    Json(String),
    /// Bytes that are not UTF-8, in hex.
    Binary(String),
    /// Decoded by its schema: pretty JSON, and which schema (e.g. `avro · schema 3`).
    Decoded { label: String, json: String },
    /// Framed with a known schema's id but not decodable by it: why, then the bytes in hex.
    Undecodable { label: String, text: String },
}

impl Shown {
    pub fn of(bytes: Option<&[u8]>) -> Shown {
        let Some(bytes) = bytes else { return Shown::Null };
        if bytes.is_empty() {
            return Shown::Empty;
        }
        match std::str::from_utf8(bytes) {
            Ok(text) => match serde_json::from_str::<serde_json::Value>(text) {
                Ok(value @ (serde_json::Value::Object(_) | serde_json::Value::Array(_))) => {
                    Shown::Json(serde_json::to_string_pretty(&value).unwrap_or_else(|_| text.to_string()))
                }
                _ => Shown::Text(truncated(text)),
            },
            Err(_) => Shown::Binary(hex_cut(bytes)),
        }
    }

    /// How a key or value is shown: decoded by its schema when `decoder` knows it, in hex
    /// when `raw` (the bytes as they are), else as [`Shown::of`].
    pub fn decoded(bytes: Option<&[u8]>, decoder: Option<&dyn SchemaDecoder>, raw: bool) -> Shown {
        let (Some(bytes), Some(decoder)) = (bytes, decoder) else { return Shown::of(bytes) };
        match decoder.decode(bytes) {
            None => Shown::of(Some(bytes)),
            Some(_) if raw => Shown::Binary(hex_cut(bytes)),
            Some(Ok(decoded)) => {
                Shown::Decoded { label: label(decoded.kind, decoded.schema_id), json: truncated(&decoded.json) }
            }
            Some(Err(why)) => Shown::Undecodable {
                label: format!("schema {} · not decoded", schema_id(bytes)),
                text: truncated(&format!("{why}\n{}", hex_cut(bytes))),
            },
        }
    }

    /// Which schema decoded it, if one did or should have.
    pub fn label(&self) -> Option<&str> {
        match self {
            Shown::Decoded { label, .. } | Shown::Undecodable { label, .. } => Some(label),
            _ => None,
        }
    }

    /// The CSS class of its kind.
    pub fn kind(&self) -> &'static str {
        match self {
            Shown::Null => "null",
            Shown::Empty => "empty",
            Shown::Text(_) => "text",
            Shown::Json(_) => "json",
            Shown::Binary(_) => "binary",
            Shown::Decoded { .. } => "decoded",
            Shown::Undecodable { .. } => "undecodable",
        }
    }

    /// The text shown.
    pub fn text(&self) -> &str {
        match self {
            Shown::Null => "null",
            Shown::Empty => "(empty)",
            Shown::Text(text) | Shown::Json(text) | Shown::Binary(text) => text,
            Shown::Decoded { json: text, .. } | Shown::Undecodable { text, .. } => text,
        }
    }

    /// Whether `needle` occurs in the text shown (case-insensitive).
    pub fn contains(&self, needle: &str) -> bool {
        self.text().to_lowercase().contains(&needle.to_lowercase())
    }
}

fn truncated(text: &str) -> String {
    if text.len() <= SHOWN_BYTES_MAX {
        return text.to_string();
    }
    let mut end = SHOWN_BYTES_MAX;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

/// `kind · schema id`, the label of a decoded key or value.
fn label(kind: &str, schema_id: i32) -> String {
    format!("{kind} · schema {schema_id}")
}

/// The schema id of framed bytes (bytes 1 to 4).
fn schema_id(bytes: &[u8]) -> i32 {
    match bytes.get(1..5) {
        Some(&[a, b, c, d]) => i32::from_be_bytes([a, b, c, d]),
        _ => 0,
    }
}

/// The first [`SHOWN_BYTES_MAX`] of `bytes` in hex, `…` when there were more.
fn hex_cut(bytes: &[u8]) -> String {
    let cut = &bytes[..bytes.len().min(SHOWN_BYTES_MAX)];
    hex(cut) + if cut.len() < bytes.len() { "…" } else { "" }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// `bytes` in B, KiB, MiB, GiB or TiB.
pub fn size(bytes: i64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut value = bytes as f64;
    let mut unit = 0;
    while value >= 1024.0 && unit < UNITS.len() - 1 {
        value /= 1024.0;
        unit += 1;
    }
    match unit {
        0 => format!("{bytes} B"),
        _ => format!("{value:.1} {}", UNITS[unit]),
    }
}

/// A record timestamp (ms since the epoch) as UTC `YYYY-MM-DD HH:MM:SS.mmm`.
pub fn timestamp(ms: i64) -> String {
    if ms < 0 {
        return "-".to_string();
    }
    let (days, rest) = (ms.div_euclid(86_400_000), ms.rem_euclid(86_400_000));
    let (year, month, day) = civil_from_days(days);
    let (hours, minutes, seconds, millis) = (rest / 3_600_000, rest / 60_000 % 60, rest / 1000 % 60, rest % 1000);
    format!("{year:04}-{month:02}-{day:02} {hours:02}:{minutes:02}:{seconds:02}.{millis:03}")
}

/// The proleptic Gregorian date of a day count since 1970-01-01 (Howard Hinnant's
/// `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// What [`parse_time`] takes, said to a user whose text it refused.
pub const TIME_FORMS: &str = "the time must be YYYY-MM-DD, YYYY-MM-DD HH:MM[:SS] (UTC) or milliseconds since 1970";

/// Parses `YYYY-MM-DD`, `YYYY-MM-DDTHH:MM` or `YYYY-MM-DD HH:MM:SS` (UTC) as ms since the
/// epoch, or a plain number as ms.
pub fn parse_time(text: &str) -> Option<i64> {
    let text = text.trim();
    if let Ok(ms) = text.parse::<i64>() {
        return Some(ms);
    }
    let (date, time) = text.split_once(['T', ' ']).unwrap_or((text, "00:00"));
    let mut date_parts = date.split('-').map(|p| p.parse::<i64>().ok());
    let (year, month, day) = (date_parts.next()??, date_parts.next()??, date_parts.next()??);
    let mut time_parts = time.split(':').map(|p| p.parse::<i64>().ok());
    let hours = time_parts.next().flatten().unwrap_or(0);
    let minutes = time_parts.next().flatten().unwrap_or(0);
    let seconds = time_parts.next().flatten().unwrap_or(0);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hours > 23 || minutes > 59 || seconds > 60 {
        return None;
    }
    Some((days_from_civil(year, month, day) * 86_400 + hours * 3600 + minutes * 60 + seconds) * 1000)
}

/// Days since 1970-01-01 of a proleptic Gregorian date (the inverse of `civil_from_days`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bytes_are_shown_as_what_they_are() {
        assert_eq!(Shown::of(None), Shown::Null);
        assert_eq!(Shown::of(Some(b"")), Shown::Empty);
        assert_eq!(Shown::of(Some(b"hello")), Shown::Text("hello".into()));
        assert_eq!(Shown::of(Some(b"42")), Shown::Text("42".into()));
        assert_eq!(Shown::of(Some(br#"{"a":1}"#)), Shown::Json("{\n  \"a\": 1\n}".into()));
        assert_eq!(Shown::of(Some(&[0xff, 0x00, 0x10])), Shown::Binary("ff0010".into()));
    }

    /// Decodes bytes framed as `0, id` followed by JSON text, for schema 7 only.
    struct Framed;

    impl SchemaDecoder for Framed {
        fn decode(&self, bytes: &[u8]) -> Option<Result<SchemaDecoded, String>> {
            if bytes.len() < 5 || bytes[0] != 0 || schema_id(bytes) != 7 {
                return None;
            }
            let json = serde_json::from_slice::<serde_json::Value>(&bytes[5..]).map_err(|e| e.to_string());
            Some(json.map(|value| SchemaDecoded { kind: "avro", schema_id: 7, json: value.to_string() }))
        }
    }

    #[test]
    fn framed_bytes_are_shown_decoded_by_their_schema() {
        let framed = |id: u8, rest: &[u8]| [&[0, 0, 0, 0, id][..], rest].concat();
        let decoded = Shown::decoded(Some(&framed(7, br#"{"city":"Oslo"}"#)), Some(&Framed), false);
        assert_eq!(decoded.text(), r#"{"city":"Oslo"}"#);
        assert_eq!(decoded.label(), Some("avro · schema 7"));
        assert!(decoded.contains("oslo"));
        let raw = Shown::decoded(Some(&framed(7, b"{}")), Some(&Framed), true);
        assert_eq!(raw, Shown::Binary("00000000077b7d".into()));
        let broken = Shown::decoded(Some(&framed(7, b"{")), Some(&Framed), false);
        assert_eq!((broken.kind(), broken.label()), ("undecodable", Some("schema 7 · not decoded")));
        assert!(broken.text().ends_with("\n00000000077b"), "{}", broken.text());
        let unknown = framed(8, b"x");
        assert_eq!(Shown::decoded(Some(&unknown), Some(&Framed), false), Shown::of(Some(&unknown)));
        assert_eq!(Shown::decoded(None, Some(&Framed), false), Shown::Null);
        let long = framed(7, format!("[{}1]", "1,".repeat(SHOWN_BYTES_MAX)).as_bytes());
        assert!(Shown::decoded(Some(&long), Some(&Framed), false).text().ends_with('…'));
    }

    #[test]
    fn times_round_trip_through_their_text() {
        assert_eq!(timestamp(0), "1970-01-01 00:00:00.000");
        assert_eq!(timestamp(1_767_225_600_123), "2026-01-01 00:00:00.123");
        assert_eq!(parse_time("2026-01-01"), Some(1_767_225_600_000));
        assert_eq!(parse_time("2026-01-01T00:00"), Some(1_767_225_600_000));
        assert_eq!(parse_time("2024-02-29 12:30:15"), Some(1_709_209_815_000));
        assert_eq!(timestamp(1_709_209_815_000), "2024-02-29 12:30:15.000");
        assert_eq!(parse_time("1000"), Some(1000));
        assert_eq!(parse_time("2026-13-01"), None);
        assert_eq!(parse_time("yesterday"), None);
    }

    #[test]
    fn sizes_read_in_binary_units() {
        assert_eq!(size(512), "512 B");
        assert_eq!(size(1536), "1.5 KiB");
        assert_eq!(size(3 * 1024 * 1024 * 1024), "3.0 GiB");
    }
}
