//! How `produce` reads records and `consume` prints them, in the formats an operator
//! already types for kcat and rpk: a template (`-f '%k %v\n'`: key, a space, the value, a
//! newline), or `json`, one object per line with the key, value and headers (`null` for a
//! missing key or value, so that an empty key and no key stay apart), or plain lines.
//!
//! The template is read as a sequence of fields and the literal text between them: a field
//! ends where the next literal starts, so `%k:%v\n` splits at the first `:` and ends at the
//! line's end. Both directions share one parser so that what `consume -f` prints, `produce
//! -f` reads back.

use std::io::{BufRead, Write};

use anyhow::{bail, Context};
use serde::{Deserialize, Serialize};

/// The help of `produce` and `consume` on their `--format`.
pub const RECORD_FORMAT_HELP: &str = "\
Record formats (-f/--format):
  text   one record per line: the value (produce -K SEP splits a key off each line)
  json   one object per line: {\"topic\", \"partition\", \"offset\", \"timestamp\", \"key\", \"value\",
         \"headers\": [{\"key\", \"value\"}]}; null for no key or value, \"\" for an empty one
  a template, as kcat's -f: %t topic, %p partition, %o offset, %T timestamp (ms), %k key,
         %v value, %h headers (name=value,...), %K / %S key / value length (-1: none), %%;
         escapes \\n \\t \\r \\0 \\\\. produce reads %k %v %p %T: each field ends where the
         text after it starts ('%k %v\\n': the key up to the first space)
Positions (-o): start, end, an offset, -N (N before the end), +N (N after the start),
  @TIME (the first record at or after it: ms since the epoch or RFC 3339)";

/// The format of `--format` for records.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordFormat {
    /// One record per line: the value (produce: `-K` splits off a key).
    Lines,
    /// One JSON object per line.
    Json,
    /// A kcat-style template.
    Template(Template),
}

impl RecordFormat {
    /// `text` (the default), `json`, or a template with at least one `%` field.
    pub fn parse(given: &str) -> anyhow::Result<RecordFormat> {
        match given {
            "text" => Ok(RecordFormat::Lines),
            "json" => Ok(RecordFormat::Json),
            template if template.contains('%') => Ok(RecordFormat::Template(Template::parse(template)?)),
            other => bail!("--format {other:?}: must be text, json or a template such as '%k %v\\n'"),
        }
    }
}

/// A field of a template.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Field {
    /// `%t`
    Topic,
    /// `%p`
    Partition,
    /// `%o`
    Offset,
    /// `%T`: milliseconds since the epoch.
    Timestamp,
    /// `%k`
    Key,
    /// `%v`
    Value,
    /// `%h`: `name=value` pairs apart by commas, as kcat prints them.
    Headers,
    /// `%K`: the key's length in bytes (-1 for no key).
    KeyLength,
    /// `%S`: the value's length in bytes (-1 for no value).
    ValueLength,
}

impl Field {
    fn of(letter: char) -> Option<Field> {
        Some(match letter {
            't' => Field::Topic,
            'p' => Field::Partition,
            'o' => Field::Offset,
            'T' => Field::Timestamp,
            'k' => Field::Key,
            'v' => Field::Value,
            'h' => Field::Headers,
            'K' => Field::KeyLength,
            'S' => Field::ValueLength,
            _ => return None,
        })
    }

    /// Fields `produce` can read: the rest describe a stored record.
    fn is_input(self) -> bool {
        matches!(self, Field::Key | Field::Value | Field::Partition | Field::Timestamp)
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Part {
    Literal(Vec<u8>),
    Field(Field),
}

/// A parsed template: fields and the literal bytes between them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Template {
    parts: Vec<Part>,
}

impl Template {
    /// `%t %p %o %T %k %v %h %K %S`, `%%` for a percent sign, and the escapes `\n \t \r
    /// \\ \0`.
    pub fn parse(text: &str) -> anyhow::Result<Template> {
        let mut parts = Vec::new();
        let mut literal = Vec::new();
        let mut chars = text.chars();
        while let Some(c) = chars.next() {
            match c {
                '%' => match chars.next() {
                    Some('%') => literal.push(b'%'),
                    Some(letter) => {
                        let field = Field::of(letter).with_context(|| {
                            format!("format %{letter}: not a field (%t %p %o %T %k %v %h %K %S, %% for %)")
                        })?;
                        if !literal.is_empty() {
                            parts.push(Part::Literal(std::mem::take(&mut literal)));
                        }
                        parts.push(Part::Field(field));
                    }
                    None => bail!("format ends with a lone %"),
                },
                '\\' => match chars.next() {
                    Some('n') => literal.push(b'\n'),
                    Some('t') => literal.push(b'\t'),
                    Some('r') => literal.push(b'\r'),
                    Some('0') => literal.push(0),
                    Some('\\') => literal.push(b'\\'),
                    Some(other) => bail!("format escape \\{other}: only \\n \\t \\r \\0 \\\\"),
                    None => bail!("format ends with a lone \\"),
                },
                other => {
                    let mut utf8 = [0u8; 4];
                    literal.extend_from_slice(other.encode_utf8(&mut utf8).as_bytes());
                }
            }
        }
        if !literal.is_empty() {
            parts.push(Part::Literal(literal));
        }
        Ok(Template { parts })
    }

    /// Writes `record` as the template says.
    pub fn write(&self, out: &mut impl Write, record: &ConsumedRecord) -> std::io::Result<()> {
        for part in &self.parts {
            match part {
                Part::Literal(bytes) => out.write_all(bytes)?,
                Part::Field(field) => match field {
                    Field::Topic => out.write_all(record.topic.as_bytes())?,
                    Field::Partition => write!(out, "{}", record.partition)?,
                    Field::Offset => write!(out, "{}", record.offset)?,
                    Field::Timestamp => write!(out, "{}", record.timestamp.unwrap_or(-1))?,
                    Field::Key => out.write_all(record.key.unwrap_or_default())?,
                    Field::Value => out.write_all(record.value.unwrap_or_default())?,
                    Field::KeyLength => write!(out, "{}", record.key.map_or(-1, |k| k.len() as i64))?,
                    Field::ValueLength => write!(out, "{}", record.value.map_or(-1, |v| v.len() as i64))?,
                    Field::Headers => {
                        for (index, (name, value)) in record.headers.iter().enumerate() {
                            if index > 0 {
                                out.write_all(b",")?;
                            }
                            out.write_all(name.as_bytes())?;
                            out.write_all(b"=")?;
                            out.write_all(value.unwrap_or_default())?;
                        }
                    }
                },
            }
        }
        Ok(())
    }

    /// The template as `produce` reads it: only fields a producer sets, and never two
    /// fields without a literal between them (where would the first end?).
    fn check_input(&self) -> anyhow::Result<()> {
        let mut previous_was_field = false;
        for part in &self.parts {
            match part {
                Part::Field(field) => {
                    if !field.is_input() {
                        bail!("produce --format: only %k %v %p %T are read (headers: --header or --format json)");
                    }
                    if previous_was_field {
                        bail!("produce --format: two fields need text between them to tell where one ends");
                    }
                    previous_was_field = true;
                }
                Part::Literal(_) => previous_was_field = false,
            }
        }
        if !self.parts.iter().any(|p| matches!(p, Part::Field(Field::Value | Field::Key))) {
            bail!("produce --format: say where the value is (%v)");
        }
        Ok(())
    }
}

/// A fetched record, as `consume` prints it.
pub struct ConsumedRecord<'a> {
    pub topic: &'a str,
    pub partition: i32,
    pub offset: i64,
    pub timestamp: Option<i64>,
    pub key: Option<&'a [u8]>,
    pub value: Option<&'a [u8]>,
    pub headers: Vec<(&'a str, Option<&'a [u8]>)>,
}

/// A header as JSON: bytes that are not UTF-8 are shown with replacement characters.
#[derive(Serialize, Deserialize)]
struct JsonHeader {
    key: String,
    value: Option<String>,
}

/// `consume --format json`: one line per record.
#[derive(Serialize)]
struct JsonRecord<'a> {
    topic: &'a str,
    partition: i32,
    offset: i64,
    timestamp: Option<i64>,
    key: Option<String>,
    value: Option<String>,
    headers: Vec<JsonHeader>,
}

fn text(bytes: Option<&[u8]>) -> Option<String> {
    bytes.map(|b| String::from_utf8_lossy(b).into_owned())
}

impl ConsumedRecord<'_> {
    /// One JSON object and a newline.
    pub fn write_json(&self, out: &mut impl Write) -> anyhow::Result<()> {
        let json = JsonRecord {
            topic: self.topic,
            partition: self.partition,
            offset: self.offset,
            timestamp: self.timestamp,
            key: text(self.key),
            value: text(self.value),
            headers: self
                .headers
                .iter()
                .map(|(name, value)| JsonHeader { key: name.to_string(), value: text(*value) })
                .collect(),
        };
        serde_json::to_writer(&mut *out, &json)?;
        out.write_all(b"\n")?;
        Ok(())
    }
}

/// A record read by `produce`, before the flags (`--key`, `--header`, `--partition`) fill
/// in what the input does not say.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct InputRecord {
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: Vec<(String, Option<Vec<u8>>)>,
    pub partition: Option<i32>,
    pub timestamp: Option<i64>,
}

/// `produce --format json`: `headers` as an object or, to repeat a name, a list of
/// `{"key": .., "value": ..}`. A key or value that is not a string (an object, a number)
/// is stored as its JSON text.
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct JsonInput {
    #[serde(default)]
    key: Option<serde_json::Value>,
    #[serde(default)]
    value: Option<serde_json::Value>,
    #[serde(default)]
    headers: Option<JsonHeaders>,
    #[serde(default)]
    partition: Option<i32>,
    #[serde(default)]
    timestamp: Option<i64>,
}

#[derive(Deserialize)]
#[serde(untagged)]
enum JsonHeaders {
    Map(std::collections::BTreeMap<String, Option<String>>),
    List(Vec<JsonHeader>),
}

/// Reads records from `input` as `format` says.
pub struct RecordReader<R> {
    input: R,
    format: RecordFormat,
    /// `-K`: splits a line of [`RecordFormat::Lines`] into key and value.
    key_separator: Option<Vec<u8>>,
    /// Records read so far, to say which one is malformed.
    read: u64,
}

impl<R: BufRead> RecordReader<R> {
    pub fn new(input: R, format: RecordFormat, key_separator: Option<&str>) -> anyhow::Result<RecordReader<R>> {
        if let RecordFormat::Template(template) = &format {
            template.check_input()?;
        }
        if key_separator.is_some() && format != RecordFormat::Lines {
            bail!("-K splits lines of text: with --format, say where the key is (%k, or \"key\" in json)");
        }
        if key_separator == Some("") {
            bail!("-K: the key separator is empty");
        }
        let key_separator = key_separator.map(|s| s.as_bytes().to_vec());
        Ok(RecordReader { input, format, key_separator, read: 0 })
    }

    /// The next record, or `None` at the end of the input.
    pub fn next_record(&mut self) -> anyhow::Result<Option<InputRecord>> {
        let number = self.read + 1;
        let record = match &self.format {
            RecordFormat::Lines => self.line()?,
            RecordFormat::Json => self.json().with_context(|| format!("input record {number}"))?,
            RecordFormat::Template(template) => {
                let template = template.clone();
                self.templated(&template).with_context(|| format!("input record {number}"))?
            }
        };
        if record.is_some() {
            self.read = number;
        }
        Ok(record)
    }

    /// A line without its end (`\n` or `\r\n`), or `None` at the end.
    fn read_line(&mut self) -> anyhow::Result<Option<Vec<u8>>> {
        let mut line = Vec::new();
        if self.input.read_until(b'\n', &mut line).context("reading standard input")? == 0 {
            return Ok(None);
        }
        if line.ends_with(b"\n") {
            line.pop();
            if line.ends_with(b"\r") {
                line.pop();
            }
        }
        Ok(Some(line))
    }

    fn line(&mut self) -> anyhow::Result<Option<InputRecord>> {
        let Some(line) = self.read_line()? else { return Ok(None) };
        let split = self.key_separator.as_deref().and_then(|separator| {
            let at = line.windows(separator.len()).position(|w| w == separator)?;
            Some((line[..at].to_vec(), line[at + separator.len()..].to_vec()))
        });
        Ok(Some(match split {
            Some((key, value)) => InputRecord { key: Some(key), value: Some(value), ..InputRecord::default() },
            None => InputRecord { value: Some(line), ..InputRecord::default() },
        }))
    }

    fn json(&mut self) -> anyhow::Result<Option<InputRecord>> {
        let line = loop {
            let Some(line) = self.read_line()? else { return Ok(None) };
            if !line.iter().all(u8::is_ascii_whitespace) {
                break line;
            }
        };
        let parsed: JsonInput = serde_json::from_slice(&line).context("not a JSON record")?;
        let headers = match parsed.headers {
            None => Vec::new(),
            Some(JsonHeaders::Map(map)) => map.into_iter().map(|(k, v)| (k, v.map(String::into_bytes))).collect(),
            Some(JsonHeaders::List(list)) => {
                list.into_iter().map(|h| (h.key, h.value.map(String::into_bytes))).collect()
            }
        };
        Ok(Some(InputRecord {
            key: parsed.key.and_then(json_bytes),
            value: parsed.value.and_then(json_bytes),
            headers,
            partition: parsed.partition,
            timestamp: parsed.timestamp,
        }))
    }

    fn templated(&mut self, template: &Template) -> anyhow::Result<Option<InputRecord>> {
        let mut record = InputRecord::default();
        let parts = &template.parts;
        let mut index = 0;
        let mut started = false;
        while index < parts.len() {
            match &parts[index] {
                Part::Literal(expected) => {
                    let mut found = vec![0u8; expected.len()];
                    let read = read_fully(&mut self.input, &mut found)?;
                    if read == 0 && !started {
                        return Ok(None);
                    }
                    if read < expected.len() || &found != expected {
                        bail!("expected {:?} where the input has {:?}", lossy(expected), lossy(&found[..read]));
                    }
                    index += 1;
                }
                Part::Field(field) => {
                    let (bytes, ended) = match parts.get(index + 1) {
                        Some(Part::Literal(delimiter)) => {
                            let (mut bytes, found) = read_through(&mut self.input, delimiter)?;
                            if !found {
                                if bytes.is_empty() && !started {
                                    return Ok(None);
                                }
                                // The last record's final newline may be missing, as with lines.
                                let last = index + 2 == parts.len();
                                let unterminated = delimiter.strip_suffix(b"\n").filter(|_| last);
                                match unterminated {
                                    Some(rest) if !bytes.is_empty() && bytes.ends_with(rest) => {
                                        bytes.truncate(bytes.len() - rest.len());
                                    }
                                    _ => bail!("the input ends inside a record (no {:?} after it)", lossy(delimiter)),
                                }
                            }
                            (bytes, true)
                        }
                        _ => {
                            let mut rest = Vec::new();
                            self.input.read_to_end(&mut rest).context("reading standard input")?;
                            (rest, false)
                        }
                    };
                    if bytes.is_empty() && !started && !ended {
                        return Ok(None);
                    }
                    started = true;
                    set_field(&mut record, *field, bytes)?;
                    index += if ended { 2 } else { 1 };
                    continue;
                }
            }
            started = true;
        }
        Ok(Some(record))
    }
}

/// A string as its bytes, `null` as none, anything else as its JSON text.
fn json_bytes(value: serde_json::Value) -> Option<Vec<u8>> {
    match value {
        serde_json::Value::Null => None,
        serde_json::Value::String(text) => Some(text.into_bytes()),
        other => Some(other.to_string().into_bytes()),
    }
}

fn lossy(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn set_field(record: &mut InputRecord, field: Field, bytes: Vec<u8>) -> anyhow::Result<()> {
    let number = |what: &str| -> anyhow::Result<i64> {
        let text = std::str::from_utf8(&bytes).ok().map(str::trim).unwrap_or_default();
        text.parse().with_context(|| format!("{what} {:?} is not a number", lossy(&bytes)))
    };
    match field {
        Field::Key => record.key = Some(bytes),
        Field::Value => record.value = Some(bytes),
        Field::Partition => {
            record.partition = Some(i32::try_from(number("partition")?).context("partition out of range")?)
        }
        Field::Timestamp => record.timestamp = Some(number("timestamp")?),
        _ => unreachable!("check_input admits only input fields"),
    }
    Ok(())
}

/// Reads until `buffer` is full or the input ends; the bytes read.
fn read_fully(input: &mut impl BufRead, buffer: &mut [u8]) -> anyhow::Result<usize> {
    let mut filled = 0;
    while filled < buffer.len() {
        let read = input.read(&mut buffer[filled..]).context("reading standard input")?;
        if read == 0 {
            break;
        }
        filled += read;
    }
    Ok(filled)
}

/// The bytes before the next `delimiter` (consumed too), and whether it was found before
/// the end of the input.
fn read_through(input: &mut impl BufRead, delimiter: &[u8]) -> anyhow::Result<(Vec<u8>, bool)> {
    let last = *delimiter.last().context("empty delimiter")?;
    let mut bytes = Vec::new();
    loop {
        let read = input.read_until(last, &mut bytes).context("reading standard input")?;
        if read == 0 || bytes.last() != Some(&last) {
            return Ok((bytes, false));
        }
        if bytes.ends_with(delimiter) {
            bytes.truncate(bytes.len() - delimiter.len());
            return Ok((bytes, true));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read_all(input: &str, format: &str, separator: Option<&str>) -> anyhow::Result<Vec<InputRecord>> {
        let mut reader = RecordReader::new(input.as_bytes(), RecordFormat::parse(format)?, separator)?;
        let mut records = Vec::new();
        while let Some(record) = reader.next_record()? {
            records.push(record);
        }
        Ok(records)
    }

    fn kv(key: Option<&str>, value: &str) -> InputRecord {
        InputRecord {
            key: key.map(|k| k.as_bytes().to_vec()),
            value: Some(value.as_bytes().to_vec()),
            ..InputRecord::default()
        }
    }

    #[test]
    fn templates_print_records_as_kcat_does() {
        let template = Template::parse(r"%t %p %o %T %k=%v [%h] %K/%S 100%%\n").unwrap();
        let record = ConsumedRecord {
            topic: "t",
            partition: 2,
            offset: 7,
            timestamp: Some(1000),
            key: None,
            value: Some(b"v"),
            headers: vec![("a", Some(b"1".as_slice())), ("b", None)],
        };
        let mut out = Vec::new();
        template.write(&mut out, &record).unwrap();
        assert_eq!(String::from_utf8(out).unwrap(), "t 2 7 1000 =v [a=1,b=] -1/1 100%\n");
        let mut json = Vec::new();
        record.write_json(&mut json).unwrap();
        assert_eq!(
            String::from_utf8(json).unwrap(),
            "{\"topic\":\"t\",\"partition\":2,\"offset\":7,\"timestamp\":1000,\"key\":null,\"value\":\"v\",\
             \"headers\":[{\"key\":\"a\",\"value\":\"1\"},{\"key\":\"b\",\"value\":null}]}\n"
        );
        assert!(Template::parse("%x").is_err());
        assert!(RecordFormat::parse("yaml").is_err());
    }

    #[test]
    fn lines_split_at_the_key_separator() {
        let records = read_all("k1:v:1\nplain\r\nlast", "text", Some(":")).unwrap();
        assert_eq!(records, [kv(Some("k1"), "v:1"), kv(None, "plain"), kv(None, "last")]);
        assert!(read_all("", "json", Some(":")).is_err(), "-K with another format");
    }

    #[test]
    fn templates_read_fields_up_to_the_next_literal() {
        let records = read_all("k1 v 1\nk2 v2\n", r"%k %v\n", None).unwrap();
        assert_eq!(records, [kv(Some("k1"), "v 1"), kv(Some("k2"), "v2")]);
        let records = read_all("<a|1|x>\n<b|0|y>", r"<%k|%p|%v>\n", None).unwrap();
        assert_eq!(records[1].partition, Some(0));
        assert_eq!(records.len(), 2);
        let whole = read_all("all\nof it", "%v", None).unwrap();
        assert_eq!(whole, [kv(None, "all\nof it")]);
        assert!(read_all("k1 v1\nbroken", r"%k %v\n", None).is_err(), "a record cut short");
        assert!(read_all("", "%k%v", None).is_err(), "fields without text between them");
        assert!(read_all("", "%o %v", None).is_err(), "an output-only field");
    }

    #[test]
    fn json_lines_keep_null_apart_from_empty() {
        let input = concat!(
            "{\"key\":\"\",\"value\":\"v\",\"headers\":{\"h\":\"1\"}}\n",
            "\n",
            "{\"value\":null,\"partition\":1,\"headers\":[{\"key\":\"h\",\"value\":\"1\"},{\"key\":\"h\",\"value\":null}]}\n",
        );
        let records = read_all(input, "json", None).unwrap();
        assert_eq!(records[0].key, Some(Vec::new()));
        assert_eq!(records[0].headers, [("h".to_string(), Some(b"1".to_vec()))]);
        assert_eq!((records[1].key.as_ref(), records[1].value.as_ref(), records[1].partition), (None, None, Some(1)));
        assert_eq!(records[1].headers.len(), 2);
        let objects = read_all("{\"key\":7,\"value\":{\"a\":[1,2]}}\n", "json", None).unwrap();
        assert_eq!(
            (objects[0].key.as_deref(), objects[0].value.as_deref()),
            (Some(&b"7"[..]), Some(&b"{\"a\":[1,2]}"[..]))
        );
        let error = read_all("{\"value\":\"a\"}\n{\"vlaue\":1}\n", "json", None).unwrap_err();
        assert!(format!("{error:#}").starts_with("input record 2: not a JSON record"), "{error:#}");
    }
}
