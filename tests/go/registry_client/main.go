// Command registry_client is a Go user of Sluice's Schema Registry: franz-go's registry client
// (pkg/sr) registers and evolves an Avro schema, and franz-go's producer and consumer (pkg/kgo)
// move records encoded in Confluent's wire format (sr.Serde: magic byte, schema id, then Avro
// by hamba/avro) through a topic and back.
//
// It exists so that the Python end-to-end tests (tests/python/test_schema_registry_go.py)
// prove that Go clients, not only librdkafka's and Java's, work against Sluice. It prints a
// JSON summary on stdout and exits non-zero with a message on stderr at the first answer that
// is not what a Confluent registry and Kafka broker would give.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"reflect"
	"slices"
	"time"

	"github.com/hamba/avro/v2"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/sr"
)

// User is the record the topic carries (schema userV1).
type User struct {
	Name   string `avro:"name"`
	Visits int64  `avro:"visits"`
}

const (
	userV1 = `{"type":"record","name":"User","namespace":"sluice.test","fields":[` +
		`{"name":"name","type":"string"},{"name":"visits","type":"long"}]}`
	// BACKWARD-compatible: readers of v2 can read v1 data, the new field has a default.
	userV2WithDefault = `{"type":"record","name":"User","namespace":"sluice.test","fields":[` +
		`{"name":"name","type":"string"},{"name":"visits","type":"long"},` +
		`{"name":"email","type":"string","default":""}]}`
	// Not BACKWARD-compatible: v1 data has no value for the new field.
	userV2WithoutDefault = `{"type":"record","name":"User","namespace":"sluice.test","fields":[` +
		`{"name":"name","type":"string"},{"name":"visits","type":"long"},` +
		`{"name":"email","type":"string"}]}`
)

// Summary is what the program saw, printed as JSON.
type Summary struct {
	Subject                  string              `json:"subject"`
	SchemaID                 int                 `json:"schema_id"`
	Version                  int                 `json:"version"`
	ReregisteredID           int                 `json:"reregistered_id"`
	LatestVersion            int                 `json:"latest_version"`
	LatestSchemaType         string              `json:"latest_schema_type"`
	Subjects                 []string            `json:"subjects"`
	GlobalCompatibility      string              `json:"global_compatibility"`
	CompatibleWithDefault    bool                `json:"compatible_with_default"`
	CompatibleWithoutDefault bool                `json:"compatible_without_default"`
	IncompatibleReasons      []string            `json:"incompatible_reasons"`
	Evolved                  sr.SubjectVersion   `json:"evolved"`
	EvolvedID                int                 `json:"evolved_id"`
	Versions                 []int               `json:"versions"`
	Produced                 int                 `json:"produced"`
	Consumed                 int                 `json:"consumed"`
	HeaderSchemaIDs          []int               `json:"header_schema_ids"`
	RoundTripped             bool                `json:"round_tripped"`
	SchemaByIDType           string              `json:"schema_by_id_type"`
	SchemaByIDMatches        bool                `json:"schema_by_id_matches"`
	SubjectsByID             []string            `json:"subjects_by_id"`
	VersionsByID             []sr.SubjectVersion `json:"versions_by_id"`
	Seconds                  float64             `json:"seconds"`
}

func main() {
	brokers := flag.String("brokers", os.Getenv("SLUICE_BOOTSTRAP"), "Kafka bootstrap server (host:port)")
	registry := flag.String("registry", os.Getenv("SLUICE_REGISTRY_URL"), "Schema Registry URL")
	topic := flag.String("topic", "go-users", "topic; the schema goes to subject <topic>-value")
	records := flag.Int("records", 20, "records to produce and consume")
	timeout := flag.Duration("timeout", 60*time.Second, "deadline for the whole run")
	flag.Parse()
	if *brokers == "" || *registry == "" {
		fail("both -brokers and -registry are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	start := time.Now()
	s := run(ctx, *brokers, *registry, *topic, *records)
	s.Seconds = time.Since(start).Seconds()
	out, _ := json.MarshalIndent(s, "", "  ")
	fmt.Println(string(out))
}

func run(ctx context.Context, brokers, registry, topic string, n int) Summary {
	rcl, err := sr.NewClient(sr.URLs(registry))
	check(err, "creating the registry client")
	s := Summary{Subject: topic + "-value"}

	// (a) Register v1; registering it again returns the same id and no new version.
	created, err := rcl.CreateSchema(ctx, s.Subject, sr.Schema{Schema: userV1, Type: sr.TypeAvro})
	check(err, "registering the schema")
	s.SchemaID, s.Version = created.ID, created.Version
	expect(s.SchemaID > 0 && s.Version == 1, "registered id %d version %d, want a positive id and version 1", s.SchemaID, s.Version)
	s.ReregisteredID, err = rcl.RegisterSchema(ctx, s.Subject, sr.Schema{Schema: userV1}, -1, -1)
	check(err, "registering the same schema again")
	expect(s.ReregisteredID == s.SchemaID, "same schema registered again got id %d, want %d", s.ReregisteredID, s.SchemaID)
	latest, err := rcl.SchemaByVersion(ctx, s.Subject, -1)
	check(err, "reading the latest version")
	s.LatestVersion, s.LatestSchemaType = latest.Version, latest.Type.String()
	expect(latest.ID == s.SchemaID && latest.Version == 1 && latest.Subject == s.Subject,
		"latest version is %+v, want id %d version 1 of %s", latest, s.SchemaID, s.Subject)
	s.Subjects, err = rcl.Subjects(ctx)
	check(err, "listing subjects")
	expect(slices.Contains(s.Subjects, s.Subject), "subjects %v do not include %s", s.Subjects, s.Subject)

	// (b) Evolution under the default level (BACKWARD): a new field needs a default.
	global := rcl.Compatibility(ctx)[0]
	check(global.Err, "reading the global compatibility level")
	s.GlobalCompatibility = global.Level.String()
	ok, err := rcl.CheckCompatibility(ctx, s.Subject, -1, sr.Schema{Schema: userV2WithDefault})
	check(err, "checking the evolved schema with a default")
	s.CompatibleWithDefault = ok.Is
	expect(ok.Is, "a field added with a default was judged incompatible: %v", ok.Messages)
	bad, err := rcl.CheckCompatibility(sr.WithParams(ctx, sr.Verbose), s.Subject, -1, sr.Schema{Schema: userV2WithoutDefault})
	check(err, "checking the evolved schema without a default")
	s.CompatibleWithoutDefault, s.IncompatibleReasons = bad.Is, bad.Messages
	expect(!bad.Is, "a field added without a default was judged compatible")
	evolved, err := rcl.CreateSchema(ctx, s.Subject, sr.Schema{Schema: userV2WithDefault})
	check(err, "registering the evolved schema")
	s.Evolved, s.EvolvedID = sr.SubjectVersion{Subject: evolved.Subject, Version: evolved.Version}, evolved.ID
	expect(evolved.Version == 2 && evolved.ID != s.SchemaID, "evolved schema got %+v, want version 2 and a new id", evolved)
	s.Versions, err = rcl.SubjectVersions(ctx, s.Subject)
	check(err, "listing versions")
	expect(slices.Equal(s.Versions, []int{1, 2}), "versions %v, want [1 2]", s.Versions)

	// (c) Produce with v1 through a Serde: each value gets the 5-byte Confluent header.
	v1 := parse(userV1)
	var serde sr.Serde
	serde.Register(s.SchemaID, User{},
		sr.EncodeFn(func(v any) ([]byte, error) { return avro.Marshal(v1, v) }),
		sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(v1, b, v) }))
	sent := make([]User, n)
	producer, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.DefaultProduceTopic(topic), kgo.AllowAutoTopicCreation())
	check(err, "creating the producer")
	defer producer.Close()
	for i := range sent {
		sent[i] = User{Name: fmt.Sprintf("user-%d", i), Visits: int64(i * 1000)}
		value, err := serde.Encode(sent[i])
		check(err, "encoding a record")
		expect(len(value) > 5 && value[0] == 0, "encoded value %x lacks the Confluent header", value)
		check(producer.ProduceSync(ctx, &kgo.Record{Value: value}).FirstErr(), "producing")
		s.Produced++
	}

	// (d) Consume in a group and decode with a Serde that knows no schema up front: it learns
	// each id from the registry, as a consumer of someone else's topic does.
	consumer, err := kgo.NewClient(kgo.SeedBrokers(brokers), kgo.ConsumeTopics(topic),
		kgo.ConsumerGroup(topic+"-go-reader"), kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()))
	check(err, "creating the consumer")
	defer consumer.Close()
	var reader sr.Serde
	var got []User
	for len(got) < n {
		fetches := consumer.PollFetches(ctx)
		if ctx.Err() != nil {
			fail("consumed only %d of %d records before the deadline", len(got), n)
		}
		check(fetches.Err(), "consuming")
		for _, r := range fetches.Records() {
			var u User
			err := reader.Decode(r.Value, &u)
			if errors.Is(err, sr.ErrNotRegistered) {
				id, _, idErr := reader.DecodeID(r.Value)
				check(idErr, "reading a record's schema id")
				learn(ctx, rcl, &reader, id)
				s.HeaderSchemaIDs = append(s.HeaderSchemaIDs, id)
				err = reader.Decode(r.Value, &u)
			}
			check(err, "decoding a record")
			got = append(got, u)
		}
	}
	s.Consumed = len(got)
	s.RoundTripped = reflect.DeepEqual(got, sent)
	expect(s.RoundTripped, "consumed %v, want %v", got, sent)
	expect(slices.Equal(s.HeaderSchemaIDs, []int{s.SchemaID}), "records carried schema ids %v, want [%d]", s.HeaderSchemaIDs, s.SchemaID)

	// (e) The id names v1, used by version 1 of the subject (and by any other subject that
	// registered the same schema).
	byID, err := rcl.SchemaByID(ctx, s.SchemaID)
	check(err, "reading the schema by id")
	s.SchemaByIDType = byID.Type.String()
	s.SchemaByIDMatches = parse(byID.Schema).String() == v1.String()
	expect(s.SchemaByIDMatches, "schema %d is %s, want %s", s.SchemaID, byID.Schema, userV1)
	s.SubjectsByID, err = rcl.SubjectsByID(ctx, s.SchemaID)
	check(err, "listing the subjects of the id")
	expect(slices.Contains(s.SubjectsByID, s.Subject), "subjects of id %d are %v, without %s", s.SchemaID, s.SubjectsByID, s.Subject)
	s.VersionsByID, err = rcl.SchemaVersionsByID(ctx, s.SchemaID)
	check(err, "listing the versions of the id")
	want := sr.SubjectVersion{Subject: s.Subject, Version: 1}
	expect(slices.Contains(s.VersionsByID, want), "versions of id %d are %v, without %v", s.SchemaID, s.VersionsByID, want)
	return s
}

// learn registers schema id in serde after fetching it from the registry.
func learn(ctx context.Context, rcl *sr.Client, serde *sr.Serde, id int) {
	fetched, err := rcl.SchemaByID(ctx, id)
	check(err, fmt.Sprintf("fetching schema %d", id))
	schema := parse(fetched.Schema)
	serde.Register(id, User{}, sr.DecodeFn(func(b []byte, v any) error { return avro.Unmarshal(schema, b, v) }))
}

// parse parses an Avro schema on its own (the default cache would mix versions of one name).
func parse(text string) avro.Schema {
	schema, err := avro.ParseWithCache(text, "", &avro.SchemaCache{})
	check(err, fmt.Sprintf("parsing Avro schema %s", text))
	return schema
}

func check(err error, doing string) {
	if err != nil {
		var re *sr.ResponseError
		if errors.As(err, &re) {
			fail("%s: HTTP %d from %s %s: %s", doing, re.StatusCode, re.Method, re.URL, re.Raw)
		}
		fail("%s: %v", doing, err)
	}
}

func expect(ok bool, format string, args ...any) {
	if !ok {
		fail(format, args...)
	}
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "registry_client: "+format+"\n", args...)
	os.Exit(1)
}
