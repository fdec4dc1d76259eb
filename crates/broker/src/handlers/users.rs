//! DescribeUserScramCredentials and AlterUserScramCredentials (KIP-554): the SCRAM users
//! that SASL listeners authenticate, managed as `kafka-configs.sh --entity-type users
//! --alter --add-config 'SCRAM-SHA-256=[password=...]'` does.
//!
//! As in Kafka, the alterations of one user succeed or fail together, and no credential is
//! ever returned: Describe shows mechanisms and iteration counts only.

use std::collections::{BTreeMap, BTreeSet};

use kafka_protocol::messages::alter_user_scram_credentials_response::AlterUserScramCredentialsResult;
use kafka_protocol::messages::describe_user_scram_credentials_response::{
    CredentialInfo, DescribeUserScramCredentialsResult,
};
use kafka_protocol::messages::{
    AlterUserScramCredentialsRequest, AlterUserScramCredentialsResponse, DescribeUserScramCredentialsRequest,
    DescribeUserScramCredentialsResponse,
};
use kafka_protocol::protocol::StrBytes;
use kafka_protocol::ResponseError;
use sluice_security::scram::{self, Mechanism};
use sluice_security::Upsertion;

use super::{message, Failure};
use crate::Broker;

/// Longest SCRAM user name accepted.
pub const USER_NAME_BYTES_MAX: usize = 1024;

pub(super) fn describe(
    broker: &Broker,
    request: DescribeUserScramCredentialsRequest,
) -> DescribeUserScramCredentialsResponse {
    let mut response = DescribeUserScramCredentialsResponse::default();
    broker.with_scram_credentials(|all| {
        let wanted: Vec<String> = match request.users.filter(|users| !users.is_empty()) {
            None => all.keys().cloned().collect(),
            Some(users) => users.into_iter().map(|user| user.name.to_string()).collect(),
        };
        let mut seen = BTreeSet::new();
        let duplicates: BTreeSet<&String> = wanted.iter().filter(|user| !seen.insert(*user)).collect();
        let mut answered = BTreeSet::new();
        for user in &wanted {
            if !answered.insert(user) {
                continue;
            }
            let mut result = DescribeUserScramCredentialsResult::default();
            result.user = StrBytes::from_string(user.clone());
            if duplicates.contains(user) {
                result.error_code = ResponseError::DuplicateResource.code();
                result.error_message =
                    message("Cannot describe SCRAM credentials for the same user twice in a single request");
            } else if let Some(mechanisms) = all.get(user) {
                for (name, credential) in mechanisms {
                    let Some(mechanism) = Mechanism::from_name(name) else { continue };
                    let mut info = CredentialInfo::default();
                    info.mechanism = mechanism.code();
                    info.iterations = credential.iterations;
                    result.credential_infos.push(info);
                }
            } else {
                result.error_code = ResponseError::ResourceNotFound.code();
                result.error_message = message("Attempt to describe a user credential that does not exist");
            }
            response.results.push(result);
        }
    });
    response
}

/// One user's requested changes: upsertions and deletions.
#[derive(Default)]
struct UserChanges {
    upsertions: Vec<Upsertion>,
    deletions: Vec<(String, String)>,
    failure: Option<Failure>,
}

pub(super) async fn alter(
    broker: &Broker,
    request: AlterUserScramCredentialsRequest,
) -> AlterUserScramCredentialsResponse {
    let mut users: BTreeMap<String, UserChanges> = BTreeMap::new();
    let mut touched: BTreeSet<(String, i8)> = BTreeSet::new();
    let existing = |user: &str, mechanism: &str| broker.scram_credential(user, mechanism).is_some();
    for deletion in request.deletions {
        let user = deletion.name.to_string();
        let changes = users.entry(user.clone()).or_default();
        let checked = check(&user, deletion.mechanism, &mut touched).and_then(|mechanism| {
            if existing(&user, mechanism.name()) {
                Ok(mechanism)
            } else {
                Err((
                    ResponseError::ResourceNotFound,
                    "Attempt to delete a user credential that does not exist".to_string(),
                ))
            }
        });
        match checked {
            Ok(mechanism) => changes.deletions.push((user, mechanism.name().to_string())),
            Err(failure) => {
                changes.failure.get_or_insert(failure);
            }
        }
    }
    for upsertion in request.upsertions {
        let user = upsertion.name.to_string();
        let changes = users.entry(user.clone()).or_default();
        let checked = check(&user, upsertion.mechanism, &mut touched).and_then(|mechanism| {
            let unacceptable = |text: &str| Err((ResponseError::UnacceptableCredential, text.to_string()));
            if upsertion.iterations < scram::ITERATIONS_MIN {
                return unacceptable("Too few iterations");
            }
            if upsertion.iterations > scram::ITERATIONS_MAX {
                return unacceptable("Too many iterations");
            }
            if upsertion.salt.is_empty() || upsertion.salt.len() > scram::SALT_BYTES_MAX {
                return unacceptable("The salt must be 1 to 1024 bytes");
            }
            if !mechanism.salted_password_len_ok(&upsertion.salted_password) {
                return unacceptable("The salted password's length does not fit the mechanism");
            }
            Ok(mechanism)
        });
        match checked {
            Ok(mechanism) => {
                let credential =
                    mechanism.credential(upsertion.salt.to_vec(), &upsertion.salted_password, upsertion.iterations);
                changes.upsertions.push((user, mechanism.name().to_string(), credential));
            }
            Err(failure) => {
                changes.failure.get_or_insert(failure);
            }
        }
    }
    let mut upsertions = Vec::new();
    let mut deletions = Vec::new();
    for changes in users.values_mut() {
        if changes.failure.is_none() {
            upsertions.append(&mut changes.upsertions);
            deletions.append(&mut changes.deletions);
        }
    }
    let stored = if upsertions.is_empty() && deletions.is_empty() {
        Ok(())
    } else {
        broker.alter_scram_credentials(upsertions, deletions).await
    };
    let mut response = AlterUserScramCredentialsResponse::default();
    for (user, changes) in users {
        let mut result = AlterUserScramCredentialsResult::default();
        result.user = StrBytes::from_string(user.clone());
        match changes.failure.as_ref().or(stored.as_ref().err()) {
            Some((error, text)) => {
                result.error_code = error.code();
                result.error_message = message(text.clone());
            }
            None => tracing::info!(%user, "altered SCRAM credentials"),
        }
        response.results.push(result);
    }
    response
}

/// Checks the user name and mechanism of one alteration, and that the request alters this
/// (user, mechanism) only once.
fn check(user: &str, mechanism: i8, touched: &mut BTreeSet<(String, i8)>) -> Result<Mechanism, Failure> {
    if user.is_empty() {
        return Err((ResponseError::UnacceptableCredential, "Username must not be empty".into()));
    }
    if user.len() > USER_NAME_BYTES_MAX {
        return Err((
            ResponseError::UnacceptableCredential,
            format!("Username longer than {USER_NAME_BYTES_MAX} bytes"),
        ));
    }
    if sluice_security::is_reserved_user(user) {
        return Err((
            ResponseError::UnacceptableCredential,
            format!("{user} is reserved for brokers (its credential derives from the cluster's rpc secret)"),
        ));
    }
    let mechanism = Mechanism::from_code(mechanism)
        .ok_or_else(|| (ResponseError::UnsupportedSaslMechanism, "Unknown SCRAM mechanism".to_string()))?;
    if !touched.insert((user.to_string(), mechanism.code())) {
        return Err((
            ResponseError::DuplicateResource,
            "A user credential cannot be altered twice in the same request".into(),
        ));
    }
    Ok(mechanism)
}
