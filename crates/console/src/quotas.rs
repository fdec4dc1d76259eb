//! Client quotas (KIP-546): DescribeClientQuotas lists every entity that has one (a user,
//! a client id, both, or the default of either) with its values, AlterClientQuotas sets or
//! removes a value. An entity is named as Kafka names it: its components, each a type
//! (`user`, `client-id`) and a name, no name meaning that type's default.

use std::sync::Arc;

use kafka_protocol::messages::alter_client_quotas_request::{EntityData, EntryData, OpData};
use kafka_protocol::messages::{AlterClientQuotasRequest, DescribeClientQuotasRequest};
use kafka_protocol::protocol::StrBytes;

use crate::admin::checked;
use crate::cluster::{versions, ClusterClient};

/// The entity types a quota may be set for.
pub const ENTITY_USER: &str = "user";
pub const ENTITY_CLIENT_ID: &str = "client-id";
/// The quotas Kafka defines, in the order the page shows them.
pub const QUOTA_KEYS: [&str; 4] =
    ["producer_byte_rate", "consumer_byte_rate", "request_percentage", "controller_mutation_rate"];

/// One component of an entity: its type and name (`None`: the type's default).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct EntityPart {
    pub entity_type: String,
    pub name: Option<String>,
}

/// An entity and the quotas set for it.
pub struct QuotaEntry {
    pub entity: Vec<EntityPart>,
    /// `(key, value)` as the broker answered.
    pub values: Vec<(String, f64)>,
}

/// Every entity that has a quota, sorted by entity.
pub async fn entries(client: &Arc<ClusterClient>) -> anyhow::Result<Vec<QuotaEntry>> {
    let mut request = DescribeClientQuotasRequest::default();
    request.components = Vec::new();
    request.strict = false;
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::DESCRIBE_CLIENT_QUOTAS, request).await?;
    checked(answer.error_code, answer.error_message)?;
    let mut found: Vec<QuotaEntry> = answer
        .entries
        .unwrap_or_default()
        .into_iter()
        .map(|entry| QuotaEntry {
            entity: entry
                .entity
                .into_iter()
                .map(|part| EntityPart {
                    entity_type: part.entity_type.to_string(),
                    name: part.entity_name.map(|n| n.to_string()),
                })
                .collect(),
            values: entry.values.into_iter().map(|v| (v.key.to_string(), v.value)).collect(),
        })
        .collect();
    found.sort_by(|a, b| a.entity.cmp(&b.entity));
    Ok(found)
}

/// Sets (`Some`) or removes (`None`) each of `changes` for `entity`, in one request.
pub async fn alter(
    client: &Arc<ClusterClient>,
    entity: &[EntityPart],
    changes: &[(String, Option<f64>)],
) -> anyhow::Result<()> {
    let mut entry = EntryData::default();
    entry.entity = entity
        .iter()
        .map(|part| {
            let mut data = EntityData::default();
            data.entity_type = StrBytes::from_string(part.entity_type.clone());
            data.entity_name = part.name.clone().map(StrBytes::from_string);
            data
        })
        .collect();
    entry.ops = changes
        .iter()
        .map(|(key, value)| {
            let mut op = OpData::default();
            op.key = StrBytes::from_string(key.clone());
            op.value = value.unwrap_or(0.0);
            op.remove = value.is_none();
            op
        })
        .collect();
    let mut request = AlterClientQuotasRequest::default();
    request.entries = vec![entry];
    request.validate_only = false;
    let bootstrap = client.bootstrap().to_string();
    let answer = client.send(&bootstrap, versions::ALTER_CLIENT_QUOTAS, request).await?;
    answer.entries.into_iter().try_for_each(|result| checked(result.error_code, result.error_message))
}
