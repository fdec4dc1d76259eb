//! The cluster's SCRAM users: DescribeUserScramCredentials lists each user's mechanisms and
//! iterations (never a secret), AlterUserScramCredentials adds or replaces a credential or
//! deletes one. The console salts and hashes a new password itself (PBKDF2, as Kafka's
//! clients do), so the broker receives only the salt and the salted password.

use std::sync::Arc;

use bytes::Bytes;
use kafka_protocol::messages::alter_user_scram_credentials_request::{
    ScramCredentialDeletion, ScramCredentialUpsertion,
};
use kafka_protocol::messages::{AlterUserScramCredentialsRequest, DescribeUserScramCredentialsRequest};
use kafka_protocol::protocol::StrBytes;
use sluice_security::scram::ITERATIONS_MIN;
use sluice_security::ScramMechanism;

use crate::admin::checked;
use crate::cluster::{versions, ClusterClient};

/// Iterations of a credential set from the console: Kafka's tools' default.
pub const ITERATIONS: i32 = ITERATIONS_MIN;
/// Bytes of a new credential's random salt.
const SALT_BYTES: usize = 32;

/// One credential of one user.
pub struct CredentialRow {
    pub user: String,
    pub mechanism: String,
    pub iterations: i32,
}

/// Every user's credentials, by user then mechanism.
pub async fn credentials(client: &Arc<ClusterClient>) -> anyhow::Result<Vec<CredentialRow>> {
    let mut request = DescribeUserScramCredentialsRequest::default();
    request.users = None;
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::DESCRIBE_USER_SCRAM_CREDENTIALS, request).await?;
    checked(answer.error_code, answer.error_message)?;
    let mut rows = Vec::new();
    for result in answer.results {
        checked(result.error_code, result.error_message)?;
        for info in result.credential_infos {
            let mechanism = ScramMechanism::from_code(info.mechanism)
                .map_or_else(|| format!("mechanism {}", info.mechanism), |m| m.name().to_string());
            rows.push(CredentialRow { user: result.user.to_string(), mechanism, iterations: info.iterations });
        }
    }
    rows.sort_by(|a, b| (&a.user, &a.mechanism).cmp(&(&b.user, &b.mechanism)));
    Ok(rows)
}

/// Adds `user`'s credential for `mechanism`, or replaces it (a new password).
pub async fn set_password(
    client: &Arc<ClusterClient>,
    user: &str,
    mechanism: ScramMechanism,
    password: &str,
) -> anyhow::Result<()> {
    let salt: [u8; SALT_BYTES] = rand::random();
    let mut upsertion = ScramCredentialUpsertion::default();
    upsertion.name = StrBytes::from_string(user.to_string());
    upsertion.mechanism = mechanism.code();
    upsertion.iterations = ITERATIONS;
    upsertion.salt = Bytes::copy_from_slice(&salt);
    upsertion.salted_password = Bytes::from(mechanism.salted_password(password.as_bytes(), &salt, ITERATIONS));
    let mut request = AlterUserScramCredentialsRequest::default();
    request.upsertions = vec![upsertion];
    alter(client, request).await
}

/// Deletes `user`'s credential for `mechanism`.
pub async fn delete_credential(
    client: &Arc<ClusterClient>,
    user: &str,
    mechanism: ScramMechanism,
) -> anyhow::Result<()> {
    let mut deletion = ScramCredentialDeletion::default();
    deletion.name = StrBytes::from_string(user.to_string());
    deletion.mechanism = mechanism.code();
    let mut request = AlterUserScramCredentialsRequest::default();
    request.deletions = vec![deletion];
    alter(client, request).await
}

async fn alter(client: &Arc<ClusterClient>, request: AlterUserScramCredentialsRequest) -> anyhow::Result<()> {
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::ALTER_USER_SCRAM_CREDENTIALS, request).await?;
    answer.results.into_iter().try_for_each(|result| checked(result.error_code, result.error_message))
}
