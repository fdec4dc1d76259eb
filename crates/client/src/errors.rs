//! A refused request in the broker's own words. A response's `error_message` says what was
//! wrong (`invalid value "abc" for configuration retention.ms: expected a number`); its
//! error code alone only says which kind of thing was (`InvalidConfig`). Tools show the
//! message when the broker sent one, else the protocol's name of the code, in words.

use anyhow::bail;
use kafka_protocol::ResponseError;

/// What the broker said about `error_code`, or `None` when it is 0 (no error).
pub fn broker_error(error_code: i16, error_message: Option<&str>) -> Option<String> {
    let error = ResponseError::try_from_code(error_code)?;
    match error_message.map(str::trim).filter(|message| !message.is_empty()) {
        Some(message) => Some(message.to_string()),
        None => Some(describe(error)),
    }
}

/// `Err("what: the broker's words")` unless `error_code` is 0.
pub fn check(error_code: i16, error_message: Option<&str>, what: &str) -> anyhow::Result<()> {
    match broker_error(error_code, error_message) {
        None => Ok(()),
        Some(said) => bail!("{what}: {said}"),
    }
}

/// The protocol's name of an error, in words: "invalid config", not `InvalidConfig`.
fn describe(error: ResponseError) -> String {
    if let ResponseError::Unknown(code) = error {
        return format!("error code {code}");
    }
    let name = format!("{error:?}");
    let mut words = String::with_capacity(name.len() + 4);
    for (index, letter) in name.chars().enumerate() {
        if letter.is_uppercase() && index > 0 {
            words.push(' ');
        }
        words.extend(letter.to_lowercase());
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_broker_message_wins_over_the_code() {
        assert_eq!(broker_error(0, Some("ignored")), None);
        assert_eq!(
            broker_error(40, Some("invalid value \"abc\" for configuration retention.ms")).unwrap(),
            "invalid value \"abc\" for configuration retention.ms"
        );
        assert_eq!(broker_error(40, None).unwrap(), "invalid config");
        assert_eq!(broker_error(3, Some("  ")).unwrap(), "unknown topic or partition");
        assert_eq!(broker_error(-1, None).unwrap(), "unknown server error");
        assert_eq!(broker_error(30_000, None).unwrap(), "error code 30000");
    }
}
