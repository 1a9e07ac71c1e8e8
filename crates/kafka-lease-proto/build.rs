//! Compiles `proto/kafka_lease/v1/*.proto` (the client API and the calls between
//! instances) with protox (a Rust protobuf
//! compiler), so a fresh machine needs no `protoc`, and writes the encoded file descriptor
//! set that server reflection serves.
//!
//! A second pass generates `PartitionLeaseService`'s server and client again, with the
//! message types of the first pass, except the three whose records the gateway encodes itself
//! (`ReadResponse`, `SubscribeResponse`, `DeliverResponse`): those are `wire::Encoded` (see `src/wire.rs`). The
//! gateway serves with that server, and forwards with that client, passing a peer's bytes
//! through. The wire format is the same; only who writes the bytes differs.

use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let manifest_dir = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR")?);
    let proto_root = manifest_dir.join("../../proto");
    let proto_files = [
        proto_root.join("kafka_lease/v1/partition_lease.proto"),
        proto_root.join("kafka_lease/v1/gateway_peer.proto"),
        proto_root.join("kafka_lease/v1/errors.proto"),
    ];
    for file in &proto_files {
        println!("cargo:rerun-if-changed={}", file.display());
    }

    let file_descriptors = protox::compile(&proto_files, [&proto_root])?;
    let out_dir = PathBuf::from(std::env::var("OUT_DIR")?);
    let descriptor_path = out_dir.join("kafka_lease_v1_descriptor.bin");
    std::fs::write(
        &descriptor_path,
        prost::Message::encode_to_vec(&file_descriptors),
    )?;

    let mut service_only = file_descriptors.clone();
    service_only
        .file
        .retain(|file| file.name() == "kafka_lease/v1/partition_lease.proto");
    for file in &mut service_only.file {
        // No messages or enums: every type is the first pass's, through the extern paths.
        file.message_type.clear();
        file.enum_type.clear();
    }

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .skip_protoc_run()
        .file_descriptor_set_path(&descriptor_path)
        // A record's key, value and header values as `bytes::Bytes`: decoded from tonic's
        // receive buffer, they are slices of it, not copies (one allocation and one copy
        // less per record for every Rust reader of records).
        .bytes(".kafka_lease.v1.KafkaRecord")
        .bytes(".kafka_lease.v1.KafkaHeader")
        .compile_fds(file_descriptors)?;

    let encoded_dir = out_dir.join("encoded");
    std::fs::create_dir_all(&encoded_dir)?;
    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .skip_protoc_run()
        .out_dir(&encoded_dir)
        .extern_path(".kafka_lease.v1", "crate::v1")
        .extern_path(
            ".kafka_lease.v1.ReadResponse",
            "crate::wire::EncodedReadResponse",
        )
        .extern_path(
            ".kafka_lease.v1.SubscribeResponse",
            "crate::wire::EncodedSubscribeResponse",
        )
        .extern_path(
            ".kafka_lease.v1.DeliverResponse",
            "crate::wire::EncodedDeliverResponse",
        )
        .compile_fds(service_only)?;
    Ok(())
}
