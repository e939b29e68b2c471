//! The protobuf codec of every gRPC service of taskd: prost's, with small starting buffers.
//!
//! tonic starts the encode and the decode buffer of every call at 8 KiB. taskd's messages are
//! tens to hundreds of bytes, and a manager keeps a call open per node of the job (a thousand
//! and more): starting at 1 KiB, a buffer grows when a message needs more, and a manager of
//! 1,024 proxies holds 14 MiB less (BENCHMARKS.md).

use std::marker::PhantomData;
use tonic::codec::{BufferSettings, Codec};
use tonic_prost::ProstCodec;

/// Where each buffer starts.
const START: usize = 1024;
/// tonic's default: encoded messages are handed on once this much is buffered.
const YIELD: usize = 32 * 1024;

/// [`ProstCodec`] with buffers that start at 1 KiB (the generated services use it: see
/// `actors/build.rs`).
#[derive(Debug, Clone)]
pub(crate) struct LeanCodec<T, U>(PhantomData<(T, U)>);

impl<T, U> Default for LeanCodec<T, U> {
    fn default() -> Self {
        LeanCodec(PhantomData)
    }
}

impl<T, U> Codec for LeanCodec<T, U>
where
    T: prost::Message + Send + 'static,
    U: prost::Message + Default + Send + 'static,
{
    type Encode = T;
    type Decode = U;
    type Encoder = <ProstCodec<T, U> as Codec>::Encoder;
    type Decoder = <ProstCodec<T, U> as Codec>::Decoder;

    fn encoder(&mut self) -> Self::Encoder {
        ProstCodec::<T, U>::raw_encoder(BufferSettings::new(START, YIELD))
    }

    fn decoder(&mut self) -> Self::Decoder {
        ProstCodec::<T, U>::raw_decoder(BufferSettings::new(START, YIELD))
    }
}
