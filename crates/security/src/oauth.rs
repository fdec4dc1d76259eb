//! SASL/OAUTHBEARER (RFC 7628, KIP-255) with Kafka's secured validation (KIP-768): the
//! client sends a JWT from its identity provider; the broker checks its signature against
//! the provider's JSON Web Key Set, its expiry (with `sasl.oauthbearer.clock.skew.seconds`
//! of leeway), and, when configured, its audience and issuer. The principal is
//! `User:<claim>`, the claim named by `sasl.oauthbearer.sub.claim.name` (`sub`); a token
//! naming a user reserved for brokers is refused, whoever signed it, since that principal
//! is a super user.
//!
//! The key set is read from a `file:` URL (`sasl.oauthbearer.jwks.endpoint.url`), re-read
//! when the file changes, so keys rotate without a restart; fetching it over HTTPS is left
//! to the operator's tooling. Unsigned ("unsecured") tokens, which Kafka accepts only
//! with its development validator, and symmetric (HS*) signatures are refused.

use std::path::PathBuf;
use std::time::SystemTime;

use jsonwebtoken::jwk::JwkSet;
use jsonwebtoken::{Algorithm, DecodingKey, Validation};
use parking_lot::Mutex;

use crate::settings::OauthSettings;

/// Longest OAUTHBEARER message accepted (a JWT with its framing).
const MESSAGE_BYTES_MAX: usize = 16 * 1024;
/// Largest key-set file read.
const JWKS_FILE_BYTES_MAX: u64 = 1 << 20;

pub struct OauthValidator {
    jwks_path: PathBuf,
    /// The key set and the modification time and size of the file it was read from.
    jwks: Mutex<Option<((SystemTime, u64), JwkSet)>>,
    audience: Vec<String>,
    issuer: Option<String>,
    sub_claim: String,
    clock_skew_seconds: u64,
}

impl OauthValidator {
    /// The validator of the key set `oauth` names (OAUTHBEARER is enabled: see
    /// [`crate::oauth_validator`]).
    pub fn new(oauth: &OauthSettings) -> Result<OauthValidator, String> {
        let url = oauth.jwks_endpoint_url.as_deref().ok_or(
            "OAUTHBEARER needs sasl.oauthbearer.jwks.endpoint.url (a file: URL of the identity provider's key \
             set); unsecured tokens are not accepted",
        )?;
        let path = url.strip_prefix("file://").or_else(|| url.strip_prefix("file:")).ok_or_else(|| {
            format!("sasl.oauthbearer.jwks.endpoint.url {url:?}: only file: URLs are read (keep the key set in a file)")
        })?;
        let validator = OauthValidator {
            jwks_path: PathBuf::from(path),
            jwks: Mutex::new(None),
            audience: oauth
                .expected_audience
                .split(',')
                .map(str::trim)
                .filter(|a| !a.is_empty())
                .map(String::from)
                .collect(),
            issuer: oauth.expected_issuer.clone().filter(|i| !i.is_empty()),
            sub_claim: oauth.sub_claim_name.clone(),
            clock_skew_seconds: oauth.clock_skew_seconds,
        };
        validator.key_set().map_err(|error| format!("sasl.oauthbearer.jwks.endpoint.url: {error}"))?;
        Ok(validator)
    }

    /// The key set, re-read when its file changed.
    fn key_set(&self) -> Result<JwkSet, String> {
        let path = &self.jwks_path;
        let metadata = std::fs::metadata(path).map_err(|error| format!("{}: {error}", path.display()))?;
        let version = (metadata.modified().unwrap_or(SystemTime::UNIX_EPOCH), metadata.len());
        let mut cached = self.jwks.lock();
        if let Some((_, set)) = cached.as_ref().filter(|(read, _)| *read == version) {
            return Ok(set.clone());
        }
        if metadata.len() > JWKS_FILE_BYTES_MAX {
            return Err(format!("{}: larger than {JWKS_FILE_BYTES_MAX} bytes", path.display()));
        }
        let bytes = std::fs::read(path).map_err(|error| format!("{}: {error}", path.display()))?;
        let set: JwkSet =
            serde_json::from_slice(&bytes).map_err(|error| format!("{}: not a JWK set: {error}", path.display()))?;
        *cached = Some((version, set.clone()));
        Ok(set)
    }

    /// Checks the client's initial response (`n,,^Aauth=Bearer <jwt>^A^A`); returns the user
    /// and the token's expiry (seconds since the epoch).
    pub(crate) fn authenticate(&self, message: &[u8]) -> Result<(String, u64), String> {
        if message.len() > MESSAGE_BYTES_MAX {
            return Err("Authentication failed: OAUTHBEARER message too long".into());
        }
        let text = std::str::from_utf8(message).map_err(|_| "Authentication failed: not UTF-8".to_string())?;
        let (gs2_header, pairs) =
            text.split_once('\u{1}').ok_or("Authentication failed: invalid OAUTHBEARER client response")?;
        let authzid = match gs2_header.strip_prefix("n,").and_then(|rest| rest.strip_suffix(',')) {
            Some("") => None,
            Some(authzid) => Some(authzid.strip_prefix("a=").ok_or("Authentication failed: invalid gs2 header")?),
            None => return Err("Authentication failed: invalid gs2 header".into()),
        };
        let token = pairs
            .split('\u{1}')
            .find_map(|pair| pair.strip_prefix("auth="))
            .and_then(|auth| auth.strip_prefix("Bearer "))
            .ok_or("Authentication failed: no bearer token")?;
        let (user, expiry) = self.validate(token.trim()).map_err(|why| format!("Authentication failed: {why}"))?;
        if authzid.is_some_and(|authzid| authzid != user) {
            return Err("Authentication failed: the authorization id differs from the token's principal".into());
        }
        Ok((user, expiry))
    }

    fn validate(&self, token: &str) -> Result<(String, u64), String> {
        let header = jsonwebtoken::decode_header(token).map_err(|error| format!("invalid token: {error}"))?;
        let asymmetric = !matches!(header.alg, Algorithm::HS256 | Algorithm::HS384 | Algorithm::HS512);
        if !asymmetric {
            return Err(format!("signature algorithm {:?} is not accepted", header.alg));
        }
        let keys = self.key_set()?;
        let jwk = match &header.kid {
            Some(kid) => keys.find(kid).ok_or_else(|| format!("no key {kid:?} in the key set"))?,
            None if keys.keys.len() == 1 => &keys.keys[0],
            None => return Err("the token names no key (kid) and the key set holds several".into()),
        };
        let key = DecodingKey::from_jwk(jwk).map_err(|error| format!("key {:?}: {error}", header.kid))?;
        let mut validation = Validation::new(header.alg);
        validation.leeway = self.clock_skew_seconds;
        validation.validate_nbf = true;
        validation.set_required_spec_claims(&["exp"]);
        if self.audience.is_empty() {
            validation.validate_aud = false;
        } else {
            validation.set_audience(&self.audience);
        }
        if let Some(issuer) = &self.issuer {
            validation.set_issuer(&[issuer]);
        }
        let data = jsonwebtoken::decode::<serde_json::Map<String, serde_json::Value>>(token, &key, &validation)
            .map_err(|error| format!("invalid token: {error}"))?;
        let expiry = data.claims.get("exp").and_then(|exp| exp.as_u64()).ok_or("the token's exp is not a number")?;
        match data.claims.get(&self.sub_claim).and_then(|value| value.as_str()) {
            Some(user) if crate::reserved_users::is_reserved_user(user) => {
                Err(format!("the token's {:?} claim names {user}, a user reserved for brokers", self.sub_claim))
            }
            Some(user) if !user.is_empty() => Ok((user.to_string(), expiry)),
            _ => Err(format!("the token has no {:?} claim", self.sub_claim)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn validator() -> OauthValidator {
        OauthValidator {
            jwks_path: PathBuf::from("/nonexistent"),
            jwks: Mutex::new(None),
            audience: Vec::new(),
            issuer: None,
            sub_claim: "sub".into(),
            clock_skew_seconds: 30,
        }
    }

    #[test]
    fn malformed_client_responses_are_refused_before_any_key_is_read() {
        let v = validator();
        for bad in ["", "n,,", "p=x,,\u{1}auth=Bearer t\u{1}\u{1}", "n,,\u{1}auth=Basic t\u{1}\u{1}", "n,x,\u{1}\u{1}"]
        {
            let error = v.authenticate(bad.as_bytes()).unwrap_err();
            assert!(!error.contains("/nonexistent"), "{bad:?} reached the key set: {error}");
        }
        // Unsigned and symmetric tokens are refused by their header alone.
        let unsigned = "eyJhbGciOiJub25lIn0.eyJzdWIiOiJhbGljZSJ9.";
        assert!(v.authenticate(format!("n,,\u{1}auth=Bearer {unsigned}\u{1}\u{1}").as_bytes()).is_err());
        let hs256 = "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJhbGljZSJ9.c2ln";
        let error = v.authenticate(format!("n,,\u{1}auth=Bearer {hs256}\u{1}\u{1}").as_bytes()).unwrap_err();
        assert!(error.contains("not accepted"), "{error}");
    }
}
