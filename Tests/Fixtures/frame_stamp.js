// docs/frame-stamp.md's reader, for a canvas holding a decoded frame (the browser fixtures share it).
function readStamp(ctx, width) {
  const perRow = Math.floor(width / 16), bits = [];
  for (let i = 0; i < 74; i++) {
    const x = (i % perRow) * 16 + 4, y = Math.floor(i / perRow) * 16 + 4;
    const d = ctx.getImageData(x, y, 8, 8).data;
    let sum = 0;
    for (let p = 0; p < d.length; p += 4) sum += (d[p] + d[p + 1] + d[p + 2]) / 3;
    bits.push(sum / 64 >= 128 ? 1 : 0);
  }
  if (bits[0] !== 1 || bits[1] !== 0) return null;
  const bytes = [];
  for (let b = 0; b < 9; b++) bytes.push(bits.slice(2 + b * 8, 10 + b * 8).reduce((v, bit) => (v << 1) | bit, 0));
  let crc = 0;
  for (const byte of bytes.slice(0, 8)) {
    crc ^= byte;
    for (let k = 0; k < 8; k++) crc = crc & 0x80 ? ((crc << 1) ^ 0x07) & 0xff : (crc << 1) & 0xff;
  }
  if (crc !== bytes[8]) return null;
  const word = (o) => ((bytes[o] << 24) | (bytes[o + 1] << 16) | (bytes[o + 2] << 8) | bytes[o + 3]) >>> 0;
  return { frame: word(0), captureMs: word(4) };
}
