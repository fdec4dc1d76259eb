//! SCRAM-SHA-256 and SCRAM-SHA-512 (RFC 5802, RFC 7677) as Kafka speaks them (KIP-84):
//! the credential kept for a user, the server side of the exchange, and the check of a
//! PLAIN password against a stored credential.
//!
//! The server never holds a password: a credential is the salt, the iteration count,
//! StoredKey = H(ClientKey) and ServerKey, from which no password can be recovered.

use base64::engine::general_purpose::STANDARD as BASE64;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256, Sha512};
use sluice_cluster::ScramCredential;

/// Kafka's bounds on SCRAM iterations (ScramMechanism.minIterations / maxIterations).
pub const ITERATIONS_MIN: i32 = 4096;
pub const ITERATIONS_MAX: i32 = 16384;
/// Iterations of an unknown user's stand-in credential: Kafka's tools' default, the count
/// most credentials have.
const STAND_IN_ITERATIONS: i32 = ITERATIONS_MIN;
/// Bytes of a stand-in credential's salt.
const STAND_IN_SALT_BYTES: usize = 16;
/// Bytes of the server's nonce (before base64).
const SERVER_NONCE_BYTES: usize = 24;
/// Longest SCRAM message accepted from a client.
pub const MESSAGE_BYTES_MAX: usize = 4096;
/// Longest salt accepted in AlterUserScramCredentials.
pub const SALT_BYTES_MAX: usize = 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mechanism {
    Sha256,
    Sha512,
}

impl Mechanism {
    pub const ALL: [Mechanism; 2] = [Mechanism::Sha256, Mechanism::Sha512];

    pub fn name(self) -> &'static str {
        match self {
            Mechanism::Sha256 => "SCRAM-SHA-256",
            Mechanism::Sha512 => "SCRAM-SHA-512",
        }
    }

    pub fn from_name(name: &str) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.name() == name)
    }

    /// The protocol's ScramMechanism code (DescribeUserScramCredentials, AlterUserScramCredentials).
    pub fn code(self) -> i8 {
        match self {
            Mechanism::Sha256 => 1,
            Mechanism::Sha512 => 2,
        }
    }

    pub fn from_code(code: i8) -> Option<Mechanism> {
        Mechanism::ALL.into_iter().find(|m| m.code() == code)
    }

    fn digest_bytes(self) -> usize {
        match self {
            Mechanism::Sha256 => 32,
            Mechanism::Sha512 => 64,
        }
    }

    fn hash(self, data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => Sha256::digest(data).to_vec(),
            Mechanism::Sha512 => Sha512::digest(data).to_vec(),
        }
    }

    fn hmac(self, key: &[u8], data: &[u8]) -> Vec<u8> {
        match self {
            Mechanism::Sha256 => {
                let mut mac = Hmac::<Sha256>::new_from_slice(key).expect("HMAC takes any key length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
            Mechanism::Sha512 => {
                let mut mac = Hmac::<Sha512>::new_from_slice(key).expect("HMAC takes any key length");
                mac.update(data);
                mac.finalize().into_bytes().to_vec()
            }
        }
    }

    /// PBKDF2 of `password` (RFC 5802's Hi): what a client computes for
    /// AlterUserScramCredentials, and the server to check a PLAIN password.
    pub fn salted_password(self, password: &[u8], salt: &[u8], iterations: i32) -> Vec<u8> {
        let rounds = u32::try_from(iterations).expect("iterations validated positive");
        let mut out = vec![0u8; self.digest_bytes()];
        match self {
            Mechanism::Sha256 => pbkdf2::pbkdf2_hmac::<Sha256>(password, salt, rounds, &mut out),
            Mechanism::Sha512 => pbkdf2::pbkdf2_hmac::<Sha512>(password, salt, rounds, &mut out),
        }
        out
    }

    /// The credential for a salted password (what AlterUserScramCredentials carries).
    pub fn credential(self, salt: Vec<u8>, salted_password: &[u8], iterations: i32) -> ScramCredential {
        let client_key = self.hmac(salted_password, b"Client Key");
        ScramCredential {
            salt,
            stored_key: self.hash(&client_key),
            server_key: self.hmac(salted_password, b"Server Key"),
            iterations,
        }
    }

    /// Whether `password` is the one `credential` was made from (SASL/PLAIN against the
    /// stored SCRAM credential).
    pub fn password_matches(self, credential: &ScramCredential, password: &[u8]) -> bool {
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&credential.iterations) {
            return false;
        }
        let salted = self.salted_password(password, &credential.salt, credential.iterations);
        let candidate = self.credential(credential.salt.clone(), &salted, credential.iterations);
        constant_time_eq(&candidate.stored_key, &credential.stored_key)
    }

    /// The credential an unknown user is answered with, so that answers and timing are
    /// those of a known one: the default iterations, a salt that is the same for the same
    /// name (a client asking twice must not see a new one) but unknowable without this
    /// process's secret, and keys no password derives.
    pub(crate) fn stand_in_credential(self, user: &str) -> ScramCredential {
        static SALT_SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
        let secret = SALT_SECRET.get_or_init(rand::random);
        let salt = self.hmac(secret, format!("{}\0{user}", self.name()).as_bytes())[..STAND_IN_SALT_BYTES].to_vec();
        let unmatched: [u8; 64] = rand::random();
        ScramCredential {
            salt,
            stored_key: unmatched[..self.digest_bytes()].to_vec(),
            server_key: self.hmac(secret, b"Server Key"),
            iterations: STAND_IN_ITERATIONS,
        }
    }

    pub fn salted_password_len_ok(self, salted_password: &[u8]) -> bool {
        salted_password.len() == self.digest_bytes()
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |diff, (x, y)| diff | (x ^ y)) == 0
}

/// Why an exchange failed. Clients see SASL_AUTHENTICATION_FAILED with the message.
#[derive(Debug, PartialEq, Eq)]
pub enum ScramError {
    /// Not SCRAM as RFC 5802 writes it.
    Malformed(&'static str),
    /// Unknown user or wrong password (clients are not told which).
    InvalidCredentials,
}

impl std::fmt::Display for ScramError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ScramError::Malformed(what) => write!(f, "malformed SCRAM message: {what}"),
            ScramError::InvalidCredentials => write!(f, "invalid credentials"),
        }
    }
}

/// The server's half of one SCRAM exchange: client-first, then client-final.
pub struct ScramExchange {
    mechanism: Mechanism,
    user: String,
    credential: ScramCredential,
    client_first_bare: String,
    server_first: String,
    nonce: String,
    gs2_header: String,
}

/// Reads the `a=b` attribute named `name` from a SCRAM message part.
fn attribute(part: Option<&str>, name: char) -> Result<&str, ScramError> {
    part.and_then(|p| p.strip_prefix(name))
        .and_then(|p| p.strip_prefix('='))
        .ok_or(ScramError::Malformed("missing attribute"))
}

/// RFC 5802 saslname: `=2C` is `,` and `=3D` is `=`; any other `=` is malformed.
fn decode_saslname(name: &str) -> Result<String, ScramError> {
    let mut decoded = String::with_capacity(name.len());
    let mut rest = name;
    while let Some(at) = rest.find('=') {
        decoded.push_str(&rest[..at]);
        match rest.get(at..at + 3) {
            Some("=2C") => decoded.push(','),
            Some("=3D") => decoded.push('='),
            _ => return Err(ScramError::Malformed("bad escape in user name")),
        }
        rest = &rest[at + 3..];
    }
    decoded.push_str(rest);
    Ok(decoded)
}

impl ScramExchange {
    /// Takes the client-first message; returns the exchange and the server-first message.
    /// `lookup` finds the user's credential for this mechanism.
    pub fn start(
        mechanism: Mechanism,
        client_first: &[u8],
        lookup: impl FnOnce(&str) -> Option<ScramCredential>,
    ) -> Result<(ScramExchange, Vec<u8>), ScramError> {
        if client_first.len() > MESSAGE_BYTES_MAX {
            return Err(ScramError::Malformed("message too long"));
        }
        let text = std::str::from_utf8(client_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        // gs2-header: "n,," or "y,," (no channel binding), optionally "n,a=authzid,".
        let mut parts = text.splitn(3, ',');
        let binding = parts.next().ok_or(ScramError::Malformed("no gs2 header"))?;
        if binding != "n" && binding != "y" {
            return Err(ScramError::Malformed("channel binding is not supported"));
        }
        let authzid = parts.next().ok_or(ScramError::Malformed("no gs2 header"))?;
        let bare = parts.next().ok_or(ScramError::Malformed("no client-first-message-bare"))?;
        let mut fields = bare.split(',');
        let user = decode_saslname(attribute(fields.next(), 'n')?)?;
        let client_nonce = attribute(fields.next(), 'r')?;
        if client_nonce.is_empty() || !client_nonce.chars().all(|c| c.is_ascii_graphic() && c != ',') {
            return Err(ScramError::Malformed("bad nonce"));
        }
        // Kafka's only extension is delegation tokens (tokenauth=true), which Sluice does not issue.
        if fields.any(|extension| extension.starts_with("tokenauth=")) {
            return Err(ScramError::InvalidCredentials);
        }
        if !authzid.is_empty() && decode_saslname(attribute(Some(authzid), 'a')?)? != user {
            return Err(ScramError::Malformed("authorization id differs from the user name"));
        }
        let credential = lookup(&user).ok_or(ScramError::InvalidCredentials)?;
        let server_nonce: [u8; SERVER_NONCE_BYTES] = rand::random();
        let nonce = format!("{client_nonce}{}", BASE64.encode(server_nonce));
        let server_first = format!("r={nonce},s={},i={}", BASE64.encode(&credential.salt), credential.iterations);
        let gs2_header = format!("{binding},{authzid},");
        let exchange = ScramExchange {
            mechanism,
            user,
            credential,
            client_first_bare: bare.to_string(),
            server_first: server_first.clone(),
            nonce,
            gs2_header,
        };
        Ok((exchange, server_first.into_bytes()))
    }

    pub fn mechanism(&self) -> Mechanism {
        self.mechanism
    }

    /// Takes the client-final message; on a valid proof returns the user and the
    /// server-final message.
    pub fn finish(self, client_final: &[u8]) -> Result<(String, Vec<u8>), ScramError> {
        if client_final.len() > MESSAGE_BYTES_MAX {
            return Err(ScramError::Malformed("message too long"));
        }
        let text = std::str::from_utf8(client_final).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let (without_proof, proof) = text.rsplit_once(",p=").ok_or(ScramError::Malformed("no proof"))?;
        let mut fields = without_proof.split(',');
        let binding = BASE64.decode(attribute(fields.next(), 'c')?).map_err(|_| ScramError::Malformed("bad c="))?;
        if binding != self.gs2_header.as_bytes() {
            return Err(ScramError::Malformed("channel binding differs from the gs2 header"));
        }
        if attribute(fields.next(), 'r')? != self.nonce {
            return Err(ScramError::Malformed("nonce differs"));
        }
        let proof = BASE64.decode(proof).map_err(|_| ScramError::Malformed("bad proof"))?;
        let auth_message = format!("{},{},{}", self.client_first_bare, self.server_first, without_proof);
        let client_signature = self.mechanism.hmac(&self.credential.stored_key, auth_message.as_bytes());
        if proof.len() != client_signature.len() {
            return Err(ScramError::InvalidCredentials);
        }
        let client_key: Vec<u8> = proof.iter().zip(&client_signature).map(|(p, s)| p ^ s).collect();
        if !constant_time_eq(&self.mechanism.hash(&client_key), &self.credential.stored_key) {
            return Err(ScramError::InvalidCredentials);
        }
        let server_signature = self.mechanism.hmac(&self.credential.server_key, auth_message.as_bytes());
        Ok((self.user, format!("v={}", BASE64.encode(server_signature)).into_bytes()))
    }
}

/// The client's half of one SCRAM exchange: a follower authenticating to its leader's
/// SASL listener (`sluice_replication::PeerConnection`), and the command-line tools
/// (`sluice_security::ScramClient`).
pub struct ScramClient {
    mechanism: Mechanism,
    password: Vec<u8>,
    client_first_bare: String,
    client_nonce: String,
    /// What the server's final message must prove, once client-final is sent.
    server_signature: Option<Vec<u8>>,
}

/// RFC 5802 saslname: `,` and `=` escaped.
fn encode_saslname(name: &str) -> String {
    name.replace('=', "=3D").replace(',', "=2C")
}

impl ScramClient {
    /// Returns the exchange and the client-first message.
    pub fn start(mechanism: Mechanism, user: &str, password: &[u8]) -> (ScramClient, Vec<u8>) {
        let nonce: [u8; SERVER_NONCE_BYTES] = rand::random();
        let client_nonce = BASE64.encode(nonce);
        let client_first_bare = format!("n={},r={client_nonce}", encode_saslname(user));
        let client_first = format!("n,,{client_first_bare}").into_bytes();
        let client = ScramClient {
            mechanism,
            password: password.to_vec(),
            client_first_bare,
            client_nonce,
            server_signature: None,
        };
        (client, client_first)
    }

    /// Takes the server-first message; returns client-final (with the proof).
    pub fn respond(&mut self, server_first: &[u8]) -> Result<Vec<u8>, ScramError> {
        let text = std::str::from_utf8(server_first).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let mut fields = text.split(',');
        let nonce = attribute(fields.next(), 'r')?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() == self.client_nonce.len() {
            return Err(ScramError::Malformed("the server nonce does not extend ours"));
        }
        let salt = BASE64.decode(attribute(fields.next(), 's')?).map_err(|_| ScramError::Malformed("bad salt"))?;
        let iterations: i32 =
            attribute(fields.next(), 'i')?.parse().map_err(|_| ScramError::Malformed("bad iteration count"))?;
        if !(ITERATIONS_MIN..=ITERATIONS_MAX).contains(&iterations) {
            return Err(ScramError::Malformed("iteration count out of bounds"));
        }
        let salted = self.mechanism.salted_password(&self.password, &salt, iterations);
        let client_key = self.mechanism.hmac(&salted, b"Client Key");
        let stored_key = self.mechanism.hash(&client_key);
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = self.mechanism.hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key.iter().zip(&signature).map(|(k, s)| k ^ s).collect();
        let server_key = self.mechanism.hmac(&salted, b"Server Key");
        self.server_signature = Some(self.mechanism.hmac(&server_key, auth_message.as_bytes()));
        Ok(format!("{without_proof},p={}", BASE64.encode(proof)).into_bytes())
    }

    /// Checks the server-final message: the server knew our credential.
    pub fn verify(&self, server_final: &[u8]) -> Result<(), ScramError> {
        let expected = self.server_signature.as_ref().ok_or(ScramError::Malformed("no client-final sent"))?;
        let text = std::str::from_utf8(server_final).map_err(|_| ScramError::Malformed("not UTF-8"))?;
        let signature = BASE64.decode(attribute(Some(text), 'v')?).map_err(|_| ScramError::Malformed("bad v="))?;
        if constant_time_eq(&signature, expected) {
            Ok(())
        } else {
            Err(ScramError::InvalidCredentials)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn alice(mechanism: Mechanism) -> ScramCredential {
        let salt = b"0123456789abcdef".to_vec();
        let salted = mechanism.salted_password(b"alice-secret", &salt, ITERATIONS_MIN);
        mechanism.credential(salt, &salted, ITERATIONS_MIN)
    }

    fn exchange(mechanism: Mechanism, user: &str, password: &str) -> Result<String, ScramError> {
        let (mut client, client_first) = ScramClient::start(mechanism, user, password.as_bytes());
        let (exchange, server_first) =
            ScramExchange::start(mechanism, &client_first, |name| (name == "alice").then(|| alice(mechanism)))?;
        let client_final = client.respond(&server_first)?;
        let (user, server_final) = exchange.finish(&client_final)?;
        client.verify(&server_final)?;
        assert!(client.verify(b"v=AAAA").is_err(), "a server that does not know the credential is caught");
        Ok(user)
    }

    #[test]
    fn right_password_authenticates_and_wrong_ones_do_not() {
        for mechanism in Mechanism::ALL {
            assert_eq!(exchange(mechanism, "alice", "alice-secret"), Ok("alice".to_string()));
            assert_eq!(exchange(mechanism, "alice", "alice-secreT"), Err(ScramError::InvalidCredentials));
            assert_eq!(exchange(mechanism, "bob", "alice-secret"), Err(ScramError::InvalidCredentials));
        }
    }

    #[test]
    fn an_unknown_user_is_answered_like_a_known_one_and_fails_at_the_proof() {
        for mechanism in Mechanism::ALL {
            let stand_in = mechanism.stand_in_credential("mallory");
            assert_eq!(stand_in.salt, mechanism.stand_in_credential("mallory").salt, "the same salt each time");
            assert_ne!(stand_in.salt, mechanism.stand_in_credential("trudy").salt);
            assert_eq!(stand_in.iterations, alice(mechanism).iterations);
            assert!(!mechanism.password_matches(&stand_in, b"alice-secret"));
            let (mut client, client_first) = ScramClient::start(mechanism, "mallory", b"guess");
            let (exchange, server_first) =
                ScramExchange::start(mechanism, &client_first, |name| Some(mechanism.stand_in_credential(name)))
                    .expect("a server-first message, as for a known user");
            let client_final = client.respond(&server_first).unwrap();
            assert_eq!(exchange.finish(&client_final).err(), Some(ScramError::InvalidCredentials));
        }
    }

    #[test]
    fn rfc7677_test_vector() {
        // RFC 7677 section 3: user "user", password "pencil", 4096 iterations.
        let salt = BASE64.decode("W22ZaJ0SNY7soEsUEjb6gQ==").unwrap();
        let salted = Mechanism::Sha256.salted_password(b"pencil", &salt, 4096);
        let credential = Mechanism::Sha256.credential(salt, &salted, 4096);
        let bare = "n=user,r=rOprNGfwEbeRWgbNEkqO";
        let auth_message = format!(
            "{bare},r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096,\
             c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0"
        );
        let server_signature = Mechanism::Sha256.hmac(&credential.server_key, auth_message.as_bytes());
        assert_eq!(BASE64.encode(server_signature), "6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=");
    }

    #[test]
    fn plain_password_checked_against_the_scram_credential() {
        let credential = alice(Mechanism::Sha512);
        assert!(Mechanism::Sha512.password_matches(&credential, b"alice-secret"));
        assert!(!Mechanism::Sha512.password_matches(&credential, b"alice-secret "));
    }

    #[test]
    fn malformed_messages_are_refused() {
        let lookup = |_: &str| Some(alice(Mechanism::Sha256));
        for bad in ["", "n,,", "p=tls-unique,,n=alice,r=abc", "n,,n=al=ice,r=abc", "n,,n=alice", "n,a=bob,n=alice,r=x"]
        {
            let result = ScramExchange::start(Mechanism::Sha256, bad.as_bytes(), lookup);
            assert!(matches!(result, Err(ScramError::Malformed(_))), "{bad:?}");
        }
        assert_eq!(decode_saslname("a=2Cb=3Dc").unwrap(), "a,b=c");
        let (exchange, _) = ScramExchange::start(Mechanism::Sha256, b"n,,n=alice,r=abc", lookup).unwrap();
        assert!(matches!(exchange.finish(b"c=biws,r=other,p=AAAA"), Err(ScramError::Malformed(_))));
    }
}
