"""Power-loss test diagnostics: what a partition directory and the WAL hold for it, batch by
batch (offsets, producer sequence, keys), so a failed check explains itself."""

import struct
from pathlib import Path


def varint(buf, pos):
    shift = result = 0
    while True:
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        shift += 7
        if not b & 0x80:
            break
    return (result >> 1) ^ -(result & 1), pos


def batches(data):
    pos = 0
    while pos + 61 <= len(data):
        base, length = struct.unpack_from(">qi", data, pos)
        if length <= 0 or pos + 12 + length > len(data):
            break
        b = data[pos:pos + 12 + length]
        last_delta, = struct.unpack_from(">i", b, 23)
        pid, = struct.unpack_from(">q", b, 43)
        seq, count = struct.unpack_from(">ii", b, 53)
        attrs, = struct.unpack_from(">h", b, 21)
        keys = []
        if attrs & 7 == 0:
            rp = 61
            for _ in range(count):
                ln, rp2 = varint(b, rp)
                end = rp2 + ln
                rp2 += 1
                _, rp2 = varint(b, rp2)
                od, rp2 = varint(b, rp2)
                kl, rp2 = varint(b, rp2)
                key = bytes(b[rp2:rp2 + kl]) if kl >= 0 else None
                keys.append((base + od, key))
                rp = end
        yield dict(base=base, last=base + last_delta, pid=pid, seq=seq, count=count, keys=keys, pos=pos)
        pos += 12 + length


def describe_dir(d: Path, partition_dir: str) -> str:
    out = []
    pdir = d / partition_dir
    if not pdir.exists():
        return f"{pdir} missing"
    for f in sorted(pdir.iterdir()):
        line = f"  {f.name} {f.stat().st_size if f.is_file() else 'dir'}"
        if f.suffix == ".log":
            bs = list(batches(f.read_bytes()))
            if bs:
                line += f" batches {len(bs)} offsets {bs[0]['base']}..{bs[-1]['last']}; tail: " + " ".join(
                    f"[{b['base']}-{b['last']} pid{b['pid']} s{b['seq']} {[(o, k.decode() if k else k) for o, k in b['keys']]}]"
                    for b in bs[-4:])
        elif f.is_file() and f.stat().st_size < 200:
            line += f" = {f.read_bytes()[:100]!r}"
        out.append(line)
    wal = d / "wal"
    if wal.exists():
        for f in sorted(wal.iterdir()):
            data = f.read_bytes()
            line = f"  wal/{f.name} {len(data)}"
            pos = 0
            recs = []
            total = 0
            while pos + 8 <= len(data):
                ln, = struct.unpack_from("<I", data, pos)
                if ln == 0 or pos + 4 + ln > len(data):
                    break
                body = data[pos + 8:pos + 4 + ln]
                kind = body[8]
                plen, = struct.unpack_from("<H", body, 9)
                path = body[11:11 + plen].decode(errors="replace")
                payload = body[11 + plen:]
                total += 1
                if path.endswith(partition_dir):
                    if kind == 1:
                        bs = list(batches(payload))
                        recs.append(f"seq{struct.unpack_from('<Q', body, 0)[0]}:" + ",".join(
                            f"{b['base']}-{b['last']}" for b in bs))
                    else:
                        recs.append(f"kind{kind}")
                pos += 4 + ln
            out.append(line + f" ({total} records) for the partition: " + " ".join(recs))
    return "\n".join(out)
