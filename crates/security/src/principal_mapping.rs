//! `ssl.principal.mapping.rules`: how a client certificate's subject becomes a principal
//! name, in Kafka's syntax, so that ACLs written for Kafka's brokers hold unchanged.
//!
//! Rules are tried in order: `RULE:pattern/replacement/` (optionally `L` or `U` after the
//! last slash, to lower- or upper-case the result) applies when `pattern` matches the whole
//! RFC 2253 subject, and the result is the subject with every match replaced (`$1`... name
//! the pattern's groups); `DEFAULT` gives the subject as it is. When no rule applies, the
//! client is refused, as Kafka refuses it: falling back to another name would hand the
//! connection a principal nobody meant it to have.

use regex::Regex;

/// Rules a broker takes at most (a guard against a runaway config, far above real ones).
pub const RULES_MAX: usize = 256;

/// One parsed rule.
#[derive(Clone, Debug)]
enum Rule {
    Default,
    Replace {
        /// The pattern matching whole subjects only: whether the rule applies.
        anchored: Regex,
        /// The pattern as written: what is replaced.
        pattern: Regex,
        replacement: String,
        case: Case,
    },
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    Keep,
    Lower,
    Upper,
}

/// The parsed `ssl.principal.mapping.rules`.
#[derive(Clone, Debug)]
pub struct PrincipalMappingRules {
    rules: Vec<Rule>,
}

impl Default for PrincipalMappingRules {
    fn default() -> Self {
        PrincipalMappingRules { rules: vec![Rule::Default] }
    }
}

impl PrincipalMappingRules {
    /// Parses Kafka's syntax: rules separated by commas (a comma inside a rule's pattern
    /// or replacement is part of it), each `DEFAULT` or `RULE:pattern/replacement/[LU]`,
    /// with `\/` for a slash inside the pattern or the replacement.
    pub fn parse(text: &str) -> Result<PrincipalMappingRules, String> {
        let mut rules = Vec::new();
        let mut rest = text.trim();
        while !rest.is_empty() {
            let (rule, after) = parse_rule(rest)?;
            rules.push(rule);
            if rules.len() > RULES_MAX {
                return Err(format!("more than {RULES_MAX} rules"));
            }
            rest = after.trim_start();
            match rest.strip_prefix(',') {
                Some(after_comma) => rest = after_comma.trim_start(),
                None if rest.is_empty() => {}
                None => return Err(format!("expected a comma before {rest:?}")),
            }
        }
        if rules.is_empty() {
            return Err("no rules (DEFAULT gives the subject as it is)".into());
        }
        Ok(PrincipalMappingRules { rules })
    }

    /// The principal name of a certificate subject, or `None` when no rule applies.
    pub fn apply(&self, subject: &str) -> Option<String> {
        self.rules.iter().find_map(|rule| match rule {
            Rule::Default => Some(subject.to_string()),
            Rule::Replace { anchored, pattern, replacement, case } => {
                if !anchored.is_match(subject) {
                    return None;
                }
                let replaced = pattern.replace_all(subject, replacement.as_str()).into_owned();
                Some(match case {
                    Case::Keep => replaced,
                    Case::Lower => replaced.to_lowercase(),
                    Case::Upper => replaced.to_uppercase(),
                })
            }
        })
    }
}

/// One rule at the start of `text` and what follows it.
fn parse_rule(text: &str) -> Result<(Rule, &str), String> {
    if let Some(after) = text.strip_prefix("DEFAULT") {
        return Ok((Rule::Default, after));
    }
    let Some(body) = text.strip_prefix("RULE:") else {
        return Err(format!("a rule is DEFAULT or RULE:pattern/replacement/[LU], got {text:?}"));
    };
    let (pattern, after_pattern) = until_slash(body).ok_or_else(|| format!("rule {text:?} has no replacement"))?;
    let (replacement, after) =
        until_slash(after_pattern).ok_or_else(|| format!("rule {text:?} does not end with a slash"))?;
    let (case, after) = match after.chars().next() {
        Some('L') => (Case::Lower, &after[1..]),
        Some('U') => (Case::Upper, &after[1..]),
        _ => (Case::Keep, after),
    };
    // Anchored, as Java's `Matcher.matches()` is: the whole subject must match.
    let anchored = Regex::new(&format!("^(?:{pattern})$"))
        .map_err(|error| format!("rule {text:?}: bad pattern {pattern:?}: {error}"))?;
    let pattern = Regex::new(&pattern).map_err(|error| format!("rule {text:?}: bad pattern {pattern:?}: {error}"))?;
    Ok((Rule::Replace { anchored, pattern, replacement: java_replacement(&replacement), case }, after))
}

/// The text before the next unescaped slash (with `\/` unescaped) and what follows it.
fn until_slash(text: &str) -> Option<(String, &str)> {
    let mut taken = String::new();
    let mut chars = text.char_indices();
    while let Some((index, c)) = chars.next() {
        match c {
            '\\' if text[index + 1..].starts_with('/') => {
                taken.push('/');
                chars.next();
            }
            '/' => return Some((taken, &text[index + 1..])),
            c => taken.push(c),
        }
    }
    None
}

/// Java's replacement syntax (`$1`, `\$` for a dollar) in the regex crate's (`${1}`, `$$`).
fn java_replacement(replacement: &str) -> String {
    let mut converted = String::with_capacity(replacement.len());
    let mut chars = replacement.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '\\' => match chars.next() {
                Some('$') => converted.push_str("$$"),
                Some(other) => converted.push(other),
                None => {}
            },
            '$' => {
                let mut digits = String::new();
                while let Some(digit) = chars.peek().filter(|d| d.is_ascii_digit()) {
                    digits.push(*digit);
                    chars.next();
                }
                match digits.is_empty() {
                    true => converted.push_str("$$"),
                    false => converted.push_str(&format!("${{{digits}}}")),
                }
            }
            c => converted.push(c),
        }
    }
    converted
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kafka_documented_rules_map_as_kafka_maps_them() {
        let rules = PrincipalMappingRules::parse(
            r"RULE:^CN=(.*?),OU=ServiceUsers.*$/$1/,RULE:^CN=(.*?),OU=(.*?),O=(.*?),L=(.*?),ST=(.*?),C=(.*?)$/$1@$2/L,RULE:^.*[Cc][Nn]=([a-zA-Z0-9.]*).*$/$1/L,DEFAULT",
        )
        .unwrap();
        assert_eq!(
            rules.apply("CN=serviceuser,OU=ServiceUsers,O=Unknown,L=Unknown,ST=Unknown,C=Unknown").unwrap(),
            "serviceuser"
        );
        assert_eq!(
            rules.apply("CN=adminUser,OU=Admin,O=Unknown,L=Unknown,ST=Unknown,C=Unknown").unwrap(),
            "adminuser@admin"
        );
        assert_eq!(rules.apply("cn=Client.Example,dc=org").unwrap(), "client.example");
        assert_eq!(rules.apply("OU=nothing").unwrap(), "OU=nothing");
    }

    #[test]
    fn no_rule_that_applies_refuses_the_subject_and_upper_case_applies() {
        let rules = PrincipalMappingRules::parse(r"RULE:^CN=([^,]*),O=acme$/$1/U").unwrap();
        assert_eq!(rules.apply("CN=app,O=acme").unwrap(), "APP");
        assert_eq!(rules.apply("CN=app,O=other"), None);
        assert_eq!(PrincipalMappingRules::default().apply("CN=x").unwrap(), "CN=x");
    }

    #[test]
    fn slashes_commas_and_dollars_inside_rules_are_theirs() {
        let rules = PrincipalMappingRules::parse(r"RULE:^CN=([^,]*),O=a\/b$/\$$1\/x/").unwrap();
        assert_eq!(rules.apply("CN=app,O=a/b").unwrap(), "$app/x");
    }

    #[test]
    fn malformed_rules_are_refused_with_a_reason() {
        for (rules, expected) in [
            ("", "no rules"),
            ("RULE:abc", "no replacement"),
            ("RULE:abc/def", "does not end with a slash"),
            ("RULE:(/x/", "bad pattern"),
            ("NONSENSE", "a rule is DEFAULT or RULE"),
            ("DEFAULT DEFAULT", "expected a comma"),
        ] {
            let error = PrincipalMappingRules::parse(rules).unwrap_err();
            assert!(error.contains(expected), "{rules:?}: {error}");
        }
    }
}
