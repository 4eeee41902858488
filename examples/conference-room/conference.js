// The krakl development conference room (scripts/dev-room): the reference
// implementation of docs/join-codes.md for web developers.
//
// - Every publisher in the Janus VideoRoom room is a tile labelled with its
//   display name (one recvonly subscription per publisher, janus.js).
// - "Share a screen" asks the page's backend (token_server.py) for a token
//   for a name, writes the join code here in the browser and shows it as a
//   QR code (qrcode-generator) and as text.
// - "End meeting" asks the backend to destroy the room: destroying needs the
//   room's secret, which stays on the backend like the signing secret.
'use strict';

// ---- From docs/join-codes.md ("Making a code in a conference page"), unchanged. ----
// Escapes what a join code value must not hold as itself: % ; , = and any
// byte outside printable ASCII (as %XX of its UTF-8 bytes).
function joinCodeValue(text) {
  return Array.from(new TextEncoder().encode(String(text)), (b) =>
    b > 0x20 && b < 0x7f && !'%;,='.includes(String.fromCharCode(b))
      ? String.fromCharCode(b)
      : '%' + b.toString(16).toUpperCase().padStart(2, '0')).join('');
}

// kind: 'whip' | 'janus'; url: the service URL; token: from your backend;
// room: the room id (Janus); iceServers: like RTCPeerConnection's.
function makeJoinCode({ kind, url, token, room, iceServers = [] }) {
  const fields = ['v=1', 'k=' + kind, 'u=' + joinCodeValue(url)];
  if (room !== undefined && room !== null) fields.push('r=' + joinCodeValue(room));
  fields.push('t=' + joinCodeValue(token));
  for (const server of iceServers) {
    for (const u of [].concat(server.urls)) {
      const parts = server.username ? [u, server.username, server.credential] : [u];
      fields.push('ice=' + parts.map(joinCodeValue).join(','));
    }
  }
  return 'krakl:' + fields.join(';');
}

// The QR code of a join code: byte mode, level M, the smallest version that fits.
function joinCodeQR(code) {
  const qr = qrcode(0, 'M');
  qr.addData(code, 'Byte');
  qr.make();
  return qr;
}
// ---- End of the docs' snippet. ----

const room = {
  config: null,      // {kind, janus, room, iceServers} from /api/room
  janus: null,       // the Janus session
  lobby: null,       // our handle in the room: joined as a participant that never publishes
  tiles: new Map(),  // publisher id -> {display, handle, tile, video}
  ended: false,
};

const $ = (id) => document.getElementById(id);

function setStatus(text, isError = false) {
  $('status').textContent = text;
  $('status').classList.toggle('error', isError);
}

/** JSON to and from the page's backend; rejects with the backend's own words. */
async function api(path, body) {
  const response = await fetch(path, body === undefined ? {} : {
    method: 'POST', headers: { 'Content-Type': 'application/json' }, body: JSON.stringify(body),
  });
  let reply = {};
  try { reply = await response.json(); } catch (_) { /* not JSON: the status says enough */ }
  if (!response.ok) throw new Error(reply.error || `${path}: HTTP ${response.status}`);
  return reply;
}

function updateEmpty() {
  $('empty').hidden = room.tiles.size > 0 || room.ended;
}

// ---- Tiles: one recvonly subscription per publisher ----

function addTile(publisher) {
  if (room.tiles.has(publisher.id) || room.ended) return;
  const tile = document.createElement('figure');
  tile.className = 'tile';
  tile.dataset.feed = String(publisher.id);
  const video = document.createElement('video');
  video.autoplay = true;
  video.muted = true;
  video.playsInline = true;
  const label = document.createElement('figcaption');
  label.className = 'label';
  // A display name is anyone's text: textContent, never HTML.
  label.textContent = publisher.display || `publisher ${publisher.id}`;
  tile.append(video, label);
  $('tiles').append(tile);
  const entry = { display: publisher.display, handle: null, tile, video };
  room.tiles.set(publisher.id, entry);
  updateEmpty();

  room.janus.attach({
    plugin: 'janus.plugin.videoroom',
    success: (handle) => {
      entry.handle = handle;
      handle.send({ message: { request: 'join', room: room.config.room, ptype: 'subscriber', streams: [{ feed: publisher.id }] } });
    },
    error: (error) => setStatus(`Cannot watch ${publisher.display}: ${error}`, true),
    onmessage: (message, jsep) => {
      if (message.error) setStatus(`Cannot watch ${publisher.display}: ${message.error}`, true);
      if (!jsep) return;
      // No tracks of our own: every offered stream is accepted receive-only.
      entry.handle.createAnswer({
        jsep,
        tracks: [],
        success: (answer) => entry.handle.send({ message: { request: 'start', room: room.config.room }, jsep: answer }),
        error: (error) => setStatus(`Cannot watch ${publisher.display}: ${error}`, true),
      });
    },
    onremotetrack: (track, mid, on) => {
      // Called on add and again on unmute: attach the track once.
      if (track.kind !== 'video' || !on) return;
      const current = video.srcObject && video.srcObject.getVideoTracks()[0];
      if (current && current.id === track.id) return;
      video.srcObject = new MediaStream([track]);
      video.play().catch(() => { /* muted autoplay is allowed; a refusal shows as a still tile */ });
    },
  });
}

function removeTile(id) {
  const entry = room.tiles.get(id);
  if (!entry) return;
  room.tiles.delete(id);
  entry.tile.remove();
  if (entry.handle) entry.handle.detach();
  updateEmpty();
}

function meetingEnded(text) {
  if (room.ended) return;
  room.ended = true;
  for (const id of [...room.tiles.keys()]) removeTile(id);
  $('share-panel').hidden = true;
  $('share-screen').disabled = true;
  $('end-meeting').textContent = 'Start a new meeting';
  $('end-meeting').classList.remove('danger');
  setStatus(text);
  updateEmpty();
}

// ---- The room: join as a participant that only watches ----

function onRoomMessage(message) {
  const event = message.videoroom;
  if (event === 'joined') {
    setStatus(`In room ${room.config.room}.`);
  } else if (event === 'destroyed') {
    meetingEnded('The meeting was ended.');
    return;
  } else if (message.error) {
    setStatus(`The room refused: ${message.error}`, true);
    return;
  }
  for (const publisher of message.publishers || []) addTile(publisher);
  if (message.unpublished !== undefined) removeTile(message.unpublished);
  if (message.leaving !== undefined) removeTile(message.leaving);
}

function joinRoom() {
  room.janus = new Janus({
    server: room.config.janus,
    // Only what the backend names: no public STUN server behind the page's back.
    iceServers: room.config.iceServers,
    success: () => room.janus.attach({
      plugin: 'janus.plugin.videoroom',
      success: (handle) => {
        room.lobby = handle;
        handle.send({ message: { request: 'join', room: room.config.room, ptype: 'publisher', display: 'conference page' } });
      },
      error: (error) => setStatus(`Cannot use the room: ${error}`, true),
      onmessage: onRoomMessage,
    }),
    error: (error) => { if (!room.ended) setStatus(`Lost the connection to Janus: ${error}`, true); },
  });
}

// ---- "Share a screen" ----

async function makeCode(event) {
  event.preventDefault();
  const identity = $('share-name').value.trim();
  $('share-error').hidden = true;
  $('make-code').disabled = true;
  try {
    const { token, expires } = await api('/api/screen-token', { identity });
    const code = makeJoinCode({ kind: room.config.kind, url: room.config.janus, room: room.config.room, token,
                                iceServers: room.config.iceServers });
    $('join-qr').innerHTML = joinCodeQR(code).createSvgTag({ cellSize: 4, margin: 4 });
    $('join-code').value = code;
    $('join-expiry').textContent = `For “${identity}”; valid until ${new Date(expires * 1000).toLocaleTimeString()}.`;
    $('join').hidden = false;
  } catch (error) {
    $('share-error').textContent = error.message;
    $('share-error').hidden = false;
  } finally {
    $('make-code').disabled = false;
  }
}

async function endMeeting() {
  if (room.ended) { location.reload(); return; }
  $('end-meeting').disabled = true;
  try {
    await api('/api/end-meeting', {});
    // Janus tells the room's participants too ("destroyed"); whichever comes first ends it here.
    meetingEnded('The meeting was ended.');
  } catch (error) {
    setStatus(`Could not end the meeting: ${error.message}`, true);
  } finally {
    $('end-meeting').disabled = false;
  }
}

// ---- For tests and curious developers: the receive statistics of a tile ----

window.devRoom = {
  room,
  /** Chromium's inbound video numbers for the tile labelled `display`, or null. */
  async videoStats(display) {
    const entry = [...room.tiles.values()].find((e) => e.display === display);
    const pc = entry && entry.handle && entry.handle.webrtcStuff.pc;
    if (!pc) return null;
    for (const report of (await pc.getStats()).values()) {
      if (report.type === 'inbound-rtp' && report.kind === 'video') {
        const { framesDecoded, framesReceived, framesDropped, freezeCount, totalFreezesDuration, jitterBufferDelay,
                jitterBufferEmittedCount, frameWidth, frameHeight, packetsLost, nackCount, pliCount } = report;
        return { framesDecoded, framesReceived, framesDropped, freezeCount, totalFreezesDuration, jitterBufferDelay,
                 jitterBufferEmittedCount, frameWidth, frameHeight, packetsLost, nackCount, pliCount };
      }
    }
    return null;
  },
};

async function start() {
  $('share-screen').addEventListener('click', () => { $('share-panel').hidden = false; $('share-name').focus(); });
  $('close-share').addEventListener('click', () => { $('share-panel').hidden = true; });
  $('share-form').addEventListener('submit', makeCode);
  $('copy-code').addEventListener('click', () => navigator.clipboard.writeText($('join-code').value)
    .catch(() => { $('join-code').select(); document.execCommand('copy'); }));
  $('end-meeting').addEventListener('click', endMeeting);
  try {
    room.config = await api('/api/room');
  } catch (error) {
    setStatus(`The page's backend does not answer: ${error.message}`, true);
    return;
  }
  $('room-name').textContent = `· room ${room.config.room}`;
  Janus.init({ debug: false, callback: joinRoom });
}

start();
