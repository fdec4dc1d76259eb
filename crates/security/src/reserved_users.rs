//! The user names no client may claim, in one place that authentication (SASL, OAUTHBEARER)
//! and the inter-broker credentials both read without depending on each other.

/// The user brokers authenticate as to each other.
pub const INTER_BROKER_USER: &str = "sluice-inter-broker";
pub const INTER_BROKER_PRINCIPAL: &str = "User:sluice-inter-broker";
/// User names no client may claim: credentials for them derive from the cluster's secret.
const RESERVED_USERS: [&str; 1] = [INTER_BROKER_USER];

const _: () = assert!(INTER_BROKER_PRINCIPAL.len() == "User:".len() + INTER_BROKER_USER.len());

/// Whether `user` is a name reserved for brokers.
pub fn is_reserved_user(user: &str) -> bool {
    RESERVED_USERS.contains(&user)
}
