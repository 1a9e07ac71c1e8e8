//! Compiles `proto/kafka_lease/v1/*.proto` (the client API and the calls between
//! instances) with protox (a Rust protobuf
//! compiler), so a fresh machine needs no `protoc`, and writes the encoded file descriptor
//! set that server reflection serves.

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

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .skip_protoc_run()
        .file_descriptor_set_path(&descriptor_path)
        .compile_fds(file_descriptors)?;
    Ok(())
}
