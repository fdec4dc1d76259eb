//! How the tools print what they read from the cluster: for a person, aligned tables with
//! rpk-style upper-case headers, counts with their plurals and times in RFC 3339; for a
//! script, the same data as JSON or YAML (`--format json|yaml`), one document per command.

use std::time::{Duration, SystemTime};

use comfy_table::{presets, CellAlignment, ColumnConstraint, ContentArrangement, Table};
use serde::Serialize;

/// Spaces between two columns of a table.
const COLUMN_GAP: u16 = 2;

/// The output format of the list and describe commands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Format {
    /// Aligned tables for a person.
    #[default]
    Text,
    /// One JSON document.
    Json,
    /// One YAML document.
    Yaml,
}

impl Format {
    /// `--format` as the list and describe commands read it.
    pub fn parse(given: &str) -> anyhow::Result<Format> {
        match given {
            "text" => Ok(Format::Text),
            "json" => Ok(Format::Json),
            "yaml" => Ok(Format::Yaml),
            other => anyhow::bail!("--format {other:?}: must be text, json or yaml"),
        }
    }

    /// Prints `value` as JSON or YAML and returns true, or returns false for text (the
    /// caller then prints its tables).
    pub fn document<T: Serialize>(self, value: &T) -> anyhow::Result<bool> {
        match self {
            Format::Text => Ok(false),
            Format::Json => {
                println!("{}", serde_json::to_string_pretty(value)?);
                Ok(true)
            }
            Format::Yaml => {
                print!("{}", serde_norway::to_string(value)?);
                Ok(true)
            }
        }
    }
}

/// A table without borders, columns apart by [`COLUMN_GAP`] spaces, numbers to the right.
pub struct TextTable {
    table: Table,
    numeric: Vec<bool>,
}

impl TextTable {
    pub fn new(headers: &[&str]) -> TextTable {
        let mut table = Table::new();
        table.load_preset(presets::NOTHING).set_content_arrangement(ContentArrangement::Disabled).set_header(headers);
        TextTable { table, numeric: vec![false; headers.len()] }
    }

    /// Right-aligns the columns named (counts and offsets).
    pub fn numeric(mut self, columns: &[&str]) -> TextTable {
        let headers: Vec<String> =
            self.table.header().map(|row| row.cell_iter().map(|c| c.content()).collect()).unwrap_or_default();
        for (index, header) in headers.iter().enumerate() {
            self.numeric[index] = columns.contains(&header.as_str());
        }
        self
    }

    pub fn row<I: IntoIterator<Item = S>, S: ToString>(&mut self, cells: I) {
        self.table.add_row(cells.into_iter().map(|cell| cell.to_string()).collect::<Vec<_>>());
    }

    /// The table's lines, without trailing blanks.
    pub fn lines(mut self) -> Vec<String> {
        let count = self.numeric.len();
        for index in 0..count {
            if let Some(column) = self.table.column_mut(index) {
                let left = 0;
                let right = if index + 1 == count { 0 } else { COLUMN_GAP };
                column.set_padding((left, right));
                column.set_constraint(ColumnConstraint::ContentWidth);
                if self.numeric[index] {
                    column.set_cell_alignment(CellAlignment::Right);
                }
            }
        }
        self.table.lines().map(|line| line.trim_end().to_string()).collect()
    }

    pub fn print(self) {
        for line in self.lines() {
            println!("{line}");
        }
    }
}

/// "1 partition", "3 partitions".
pub fn count(n: usize, singular: &str) -> String {
    if n == 1 {
        format!("1 {singular}")
    } else {
        format!("{n} {}", plural(singular))
    }
}

fn plural(singular: &str) -> String {
    if singular.ends_with('s') || singular.ends_with('x') {
        format!("{singular}es")
    } else {
        format!("{singular}s")
    }
}

/// A record timestamp (milliseconds since the epoch) in RFC 3339, UTC, to the millisecond.
pub fn rfc3339_millis(millis: i64) -> String {
    match u64::try_from(millis) {
        Ok(millis) => {
            humantime::format_rfc3339_millis(SystemTime::UNIX_EPOCH + Duration::from_millis(millis)).to_string()
        }
        Err(_) => "-".to_string(),
    }
}

/// Node ids as "0,1,2" (a table cell, not a debug dump).
pub fn ids(ids: &[i32]) -> String {
    ids.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tables_align_without_borders() {
        let mut table = TextTable::new(&["PARTITION", "LEADER", "ISR"]).numeric(&["PARTITION"]);
        table.row(["0", "1", "1,2"]);
        table.row(["10", "2", "2"]);
        assert_eq!(table.lines(), ["PARTITION  LEADER  ISR", "        0  1       1,2", "       10  2       2"]);
    }

    #[test]
    fn counts_have_plurals_and_times_are_rfc3339() {
        assert_eq!(count(1, "partition"), "1 partition");
        assert_eq!(count(0, "partition"), "0 partitions");
        assert_eq!(count(2, "class"), "2 classes");
        assert_eq!(rfc3339_millis(1_796_312_831_499), "2026-12-03T15:47:11.499Z");
        assert_eq!(rfc3339_millis(-1), "-");
        assert_eq!(ids(&[0, 1]), "0,1");
    }
}
