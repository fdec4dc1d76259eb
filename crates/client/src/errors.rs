//! A refused request in the broker's own words. A response's `error_message` says what was
//! wrong (`invalid value "abc" for configuration retention.ms: expected a number`); its
//! error code alone only says which kind of thing was (`InvalidConfig`). Tools show the
//! message when the broker sent one, else the protocol's description of the code.

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

/// The protocol's description of an error, as a clause: "configuration is invalid".
fn describe(error: ResponseError) -> String {
    let text = error.to_string();
    let text = text.trim_end_matches('.');
    let mut chars = text.chars();
    match chars.next() {
        // Keep acronyms (SASL, ACL) as they are; lower-case an ordinary first word.
        Some(first) if !chars.clone().next().is_some_and(char::is_uppercase) => {
            first.to_lowercase().chain(chars).collect()
        }
        _ => text.to_string(),
    }
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
        assert_eq!(broker_error(40, None).unwrap(), "configuration is invalid");
        assert_eq!(broker_error(3, Some("  ")).unwrap(), "this server does not host this topic-partition");
    }
}
