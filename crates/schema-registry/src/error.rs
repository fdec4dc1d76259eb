//! The registry's errors as its clients know them: Confluent's error codes (an HTTP
//! status followed by a detail digit or two) and messages, so a serializer's error
//! handling (40401 subject not found, 409 incompatible, ...) works unchanged.

/// A refused request: what the REST API answers with.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RegistryError {
    #[error("Subject '{0}' not found.")]
    SubjectNotFound(String),
    #[error("Version {0} not found.")]
    VersionNotFound(String),
    #[error("Schema {0} not found")]
    SchemaNotFound(String),
    #[error("Subject '{0}' was soft deleted.Set permanent=true to delete permanently")]
    SubjectSoftDeleted(String),
    #[error("Subject '{0}' was not deleted first before being permanently deleted")]
    SubjectNotSoftDeleted(String),
    #[error("Subject '{subject}' Version {version} was not deleted first before being permanently deleted")]
    VersionNotSoftDeleted { subject: String, version: i32 },
    #[error("Subject '{0}' does not have subject-level compatibility configured")]
    SubjectConfigNotFound(String),
    #[error("Subject '{0}' does not have subject-level mode configured")]
    SubjectModeNotFound(String),
    #[error("{0}")]
    Incompatible(String),
    #[error("Invalid schema {0}")]
    InvalidSchema(String),
    #[error("The specified version '{0}' is not a valid version id. Allowed values are between [1, 2^31-1] and the string \"latest\"")]
    InvalidVersion(String),
    #[error("Invalid compatibility level. Valid values are none, backward, forward, full, backward_transitive, forward_transitive, and full_transitive")]
    InvalidCompatibilityLevel,
    #[error("Invalid mode. Valid values are READWRITE, READONLY, IMPORT")]
    InvalidMode,
    #[error(
        "One or more references exist to the schema {{magic=1,keytype=SCHEMA,subject={subject},version={version}}}."
    )]
    ReferenceExists { subject: String, version: i32 },
    #[error("Subject {0} is in read-only mode")]
    OperationNotPermitted(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{0}")]
    NotFound(String),
    #[error("Unrecognized field or malformed body: {0}")]
    UnprocessableBody(String),
    #[error("{0}")]
    Unauthorized(String),
    #[error("{0}")]
    Forbidden(String),
    #[error("{0}")]
    UnsupportedMediaType(String),
    #[error("{0}")]
    PayloadTooLarge(String),
    #[error("Error while forwarding the request to the leader: {0}")]
    NotLeader(String),
    #[error("Error in the backend data store: {0}")]
    Store(String),
    #[error("Timed out waiting for the write to become durable")]
    Timeout,
}

impl RegistryError {
    /// The `error_code` field of the JSON body.
    pub fn code(&self) -> u32 {
        use RegistryError::*;
        match self {
            SubjectNotFound(_) => 40401,
            VersionNotFound(_) => 40402,
            SchemaNotFound(_) => 40403,
            SubjectSoftDeleted(_) => 40404,
            SubjectNotSoftDeleted(_) => 40405,
            VersionNotSoftDeleted { .. } => 40407,
            SubjectConfigNotFound(_) => 40408,
            SubjectModeNotFound(_) => 40409,
            Incompatible(_) => 409,
            InvalidSchema(_) => 42201,
            InvalidVersion(_) => 42202,
            InvalidCompatibilityLevel => 42203,
            InvalidMode => 42204,
            OperationNotPermitted(_) => 42205,
            ReferenceExists { .. } => 42206,
            BadRequest(_) => 400,
            NotFound(_) => 404,
            UnprocessableBody(_) => 422,
            Unauthorized(_) => 401,
            Forbidden(_) => 40301,
            UnsupportedMediaType(_) => 415,
            PayloadTooLarge(_) => 413,
            NotLeader(_) => 50003,
            Store(_) => 50001,
            Timeout => 50002,
        }
    }

    /// The HTTP status: the code's first three digits.
    pub fn status(&self) -> u16 {
        let code = self.code();
        let status = if code >= 10_000 { code / 100 } else { code };
        u16::try_from(status).expect("error codes start with an HTTP status")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_are_the_codes_first_three_digits() {
        assert_eq!(RegistryError::SubjectNotFound("s".into()).status(), 404);
        assert_eq!(RegistryError::Incompatible("x".into()).status(), 409);
        assert_eq!(RegistryError::InvalidSchema("x".into()).status(), 422);
        assert_eq!(RegistryError::Timeout.status(), 500);
        assert_eq!(RegistryError::UnsupportedMediaType("x".into()).status(), 415);
    }
}
