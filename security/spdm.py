"""
The attestation report of an NVIDIA Hopper-class GPU in confidential-computing mode, as NVML's
``nvmlDeviceGetConfComputeGpuAttestationReport`` returns it: the SPDM 1.1 GET_MEASUREMENTS request
the driver sent (with the verifier's nonce) followed by the GPU's response, signed by the GPU's
attestation key. Parsing only; security.nvidia checks it.

Layout (DMTF DSP0274 1.1, little-endian integers)::

    request   SPDMVersion=0x11 | 0xE0 | Param1 (bit 0: signature wanted) | Param2 (0xFF: all)
              | Nonce (32) | SlotIDParam (1)                                             37 bytes
    response  SPDMVersion=0x11 | 0x60 | Param1 | Param2 | NumberOfBlocks (1)
              | MeasurementRecordLength (3) | MeasurementRecord | Nonce (32)
              | OpaqueDataLength (2) | OpaqueData | Signature (96: ECDSA P-384 r || s)
    block     Index (1) | MeasurementSpecification (1) | MeasurementSize (2)
              | DMTFSpecMeasurementValueType (1) | DMTFSpecMeasurementValueSize (2) | value
    opaque    repeated: DataType (2) | DataSize (2) | data         (NVIDIA's field identifiers)

The signature covers the request and the response up to the signature, hashed with SHA-384.
"""

from __future__ import annotations

from dataclasses import dataclass

REQUEST_LENGTH = 37
SIGNATURE_LENGTH = 96
NONCE_LENGTH = 32
MAX_REPORT = 8192  # NVML_CC_GPU_ATTESTATION_REPORT_SIZE
SPDM_1_1 = 0x11
GET_MEASUREMENTS = 0xE0
MEASUREMENTS = 0x60

# NVIDIA's opaque-data field identifiers (the ones Meridian reads).
OPAQUE_DRIVER_VERSION = 3
OPAQUE_VBIOS_VERSION = 6
OPAQUE_CHIP_SKU = 15
OPAQUE_PROJECT = 17
OPAQUE_PROJECT_SKU = 18
OPAQUE_FWID = 20


@dataclass(frozen=True)
class Report:
    """A parsed report: what was asked, what was measured, and the bytes the signature covers."""

    request_nonce: bytes
    response_nonce: bytes
    measurements: dict[int, bytes]  # SPDM block index (1-based) -> measurement value
    opaque: dict[int, bytes]
    signed: bytes
    signature: bytes

    @property
    def driver_version(self) -> str:
        return _cstring(self.opaque.get(OPAQUE_DRIVER_VERSION, b""))

    @property
    def vbios_version(self) -> str:
        """As nvidia-smi prints it: ``96.00.9F.00.01`` from the little-endian word and the OEM byte."""
        raw = self.opaque.get(OPAQUE_VBIOS_VERSION, b"")
        if len(raw) < 5:
            return ""
        word = int.from_bytes(raw[:4], "little")
        return f"{word >> 24:02X}.{(word >> 16) & 0xFF:02X}.{(word >> 8) & 0xFF:02X}.{word & 0xFF:02X}.{raw[4]:02X}"

    @property
    def fwid(self) -> bytes:
        return self.opaque.get(OPAQUE_FWID, b"")

    @property
    def board(self) -> str:
        """Project, project SKU and chip SKU: how NVIDIA names a VBIOS RIM (``1010_0200_882``)."""
        return "_".join(_cstring(self.opaque.get(field, b"")) for field in
                        (OPAQUE_PROJECT, OPAQUE_PROJECT_SKU, OPAQUE_CHIP_SKU))


def parse(data: bytes) -> Report:
    """Parse a report; ValueError says which field is wrong and where."""
    if not isinstance(data, bytes | bytearray):
        raise ValueError("the report must be bytes")
    data = bytes(data)
    if not REQUEST_LENGTH + 8 + NONCE_LENGTH + 2 + SIGNATURE_LENGTH <= len(data) <= MAX_REPORT:
        raise ValueError(f"the report is {len(data)} bytes; an SPDM measurement report is "
                         f"{REQUEST_LENGTH + 8 + NONCE_LENGTH + 2 + SIGNATURE_LENGTH} to {MAX_REPORT}")
    request, response = data[:REQUEST_LENGTH], data[REQUEST_LENGTH:]
    if request[0] != SPDM_1_1 or request[1] != GET_MEASUREMENTS:
        raise ValueError(f"the request is not SPDM 1.1 GET_MEASUREMENTS (version {request[0]:#04x}, "
                         f"code {request[1]:#04x})")
    if not request[2] & 1:
        raise ValueError("the request did not ask for a signed response")
    if response[0] != SPDM_1_1 or response[1] != MEASUREMENTS:
        raise ValueError(f"the response is not SPDM 1.1 MEASUREMENTS (version {response[0]:#04x}, "
                         f"code {response[1]:#04x})")
    blocks = response[4]
    record_length = int.from_bytes(response[5:8], "little")
    at = 8 + record_length
    if at + NONCE_LENGTH + 2 > len(response):
        raise ValueError(f"the measurement record ({record_length} bytes) runs past the response")
    measurements = _blocks(response[8:at], blocks)
    response_nonce = response[at:at + NONCE_LENGTH]
    at += NONCE_LENGTH
    opaque_length = int.from_bytes(response[at:at + 2], "little")
    at += 2
    if at + opaque_length + SIGNATURE_LENGTH != len(response):
        raise ValueError(f"the response is {len(response)} bytes, its fields add up to "
                         f"{at + opaque_length + SIGNATURE_LENGTH}")
    opaque = _opaque(response[at:at + opaque_length])
    return Report(request_nonce=request[4:4 + NONCE_LENGTH], response_nonce=response_nonce,
                  measurements=measurements, opaque=opaque, signed=data[:-SIGNATURE_LENGTH],
                  signature=data[-SIGNATURE_LENGTH:])


def _blocks(record: bytes, count: int) -> dict[int, bytes]:
    measurements: dict[int, bytes] = {}
    at = 0
    for _ in range(count):
        if at + 7 > len(record):
            raise ValueError(f"measurement block {len(measurements) + 1} of {count} is cut short")
        index, size = record[at], int.from_bytes(record[at + 2:at + 4], "little")
        value_size = int.from_bytes(record[at + 5:at + 7], "little")
        if value_size + 3 != size or at + 4 + size > len(record):
            raise ValueError(f"measurement block {index} declares {size} bytes, its value {value_size}")
        if index in measurements:
            raise ValueError(f"measurement block {index} appears twice")
        measurements[index] = record[at + 7:at + 7 + value_size]
        at += 4 + size
    if at != len(record):
        raise ValueError(f"the measurement record has {len(record) - at} bytes after its {count} blocks")
    return measurements


def _opaque(data: bytes) -> dict[int, bytes]:
    fields: dict[int, bytes] = {}
    at = 0
    while at < len(data):
        if at + 4 > len(data):
            raise ValueError("the opaque data ends inside a field header")
        kind, size = int.from_bytes(data[at:at + 2], "little"), int.from_bytes(data[at + 2:at + 4], "little")
        if at + 4 + size > len(data):
            raise ValueError(f"opaque field {kind} runs past the opaque data")
        fields.setdefault(kind, data[at + 4:at + 4 + size])
        at += 4 + size
    return fields


def _cstring(raw: bytes) -> str:
    text = raw.split(b"\x00", 1)[0]
    try:
        return text.decode("ascii")
    except UnicodeDecodeError:
        return text.hex()
