/// The viewer's page: HTML, script and style served by the agent itself,
/// with nothing from elsewhere (no URL outside this origin, so it works
/// offline and leaks nothing), under a Content-Security-Policy that allows
/// only this origin's script and style.
///
/// The script is a plain WHEP player: a recvonly RTCPeerConnection, its
/// offer POSTed at once (no wait for ICE gathering: the agent is ICE-lite), the answer
/// applied; live numbers from getStats; a message when sharing ends
/// (`/status` says so, DTLS is closed by the agent, or the connection fails or closes); DELETE of the
/// session when the page goes away (fetch keepalive: sendBeacon cannot
/// DELETE). When ICE fails (or stays disconnected for 3 s) it restarts ICE
/// as WHEP does (RFC 9725 §4.3.2: PATCH with `If-Match: *` and the new
/// offer's ICE lines, the answer fragment applied) and says "Reconnecting…"
/// meanwhile; DTLS and the video go on (`window.kraklRestartIce()` for tests). The access token comes from the URL fragment (#token=…), is kept
/// for this tab only (sessionStorage), and is removed from the address bar.
enum ViewerPage {
    static let contentSecurityPolicy = "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src data:; "
        + "media-src 'self' blob:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"

    static let html = """
    <!doctype html>
    <html lang="en">
    <head>
    <meta charset="utf-8">
    <meta name="viewport" content="width=device-width, initial-scale=1">
    <title>Shared screen · krakl</title>
    <link rel="icon" href="data:,">
    <link rel="stylesheet" href="/viewer.css">
    </head>
    <body>
    <main>
    <video id="video" autoplay muted playsinline></video>
    <p id="state" role="status">Starting…</p>
    <dl id="numbers">
    <div><dt>Resolution</dt><dd id="resolution">–</dd></div>
    <div><dt>Frames/s</dt><dd id="fps">–</dd></div>
    <div><dt>Bitrate</dt><dd id="bitrate">–</dd></div>
    <div><dt>Round trip</dt><dd id="rtt">–</dd></div>
    <div><dt>Viewers</dt><dd id="viewers">–</dd></div>
    </dl>
    </main>
    <script src="/viewer.js"></script>
    </body>
    </html>

    """

    static let style = """
    html, body { margin: 0; height: 100%; background: #111; color: #eee; font: 15px/1.4 system-ui, sans-serif; }
    main { display: flex; flex-direction: column; height: 100%; }
    video { flex: 1; min-height: 0; width: 100%; background: #000; object-fit: contain; }
    #state { margin: 0; padding: .4em .8em; background: #333; }
    #state.live { background: #1d5e2f; }
    #state.warn { background: #7a5b12; }
    #state.ended { background: #7a1d1d; font-weight: bold; }
    #numbers { display: flex; flex-wrap: wrap; gap: 1.5em; margin: 0; padding: .4em .8em; }
    #numbers div { display: flex; gap: .4em; }
    dt { color: #aaa; } dd { margin: 0; font-variant-numeric: tabular-nums; }

    """

    static let script = """
    'use strict';
    (() => {
      const $ = (id) => document.getElementById(id);
      const video = $('video');
      const state = { text: 'Starting', ended: false, offerSent: false, resource: null, answered: false };
      window.kraklViewer = state;   // read by tests

      function say(text, kind) {
        state.text = text;
        $('state').textContent = text;
        $('state').className = kind || '';
      }
      function show(id, text) { $(id).textContent = text; }
      // Connected: watching, unless the agent says nothing is shared right now (`/status`'s idle:
      // the home screen's viewer between two sessions; frames start again with the next one).
      state.idle = null;
      function showLive() {
        if (state.idle) say(state.idle, 'warn');
        else say('Watching the shared screen.', 'live');
      }

      // The token travels in the fragment (never sent to a server); kept for this tab, then
      // taken out of the address bar so it is not left on screen or in history.
      let token = sessionStorage.getItem('kraklToken');
      const match = /(?:^#|&)token=([A-Za-z0-9_-]+)/.exec(location.hash);
      if (match) {
        token = match[1];
        sessionStorage.setItem('kraklToken', token);
        history.replaceState(null, '', location.pathname + location.search);
      }
      const auth = token ? { Authorization: 'Bearer ' + token } : {};

      let pc = null;
      let statsTimer = null;
      let last = null;
      // ICE restarts: one at a time, a few in a row at most before giving up.
      let restarting = null;
      let restartsInARow = 0;
      let disconnectedTimer = null;
      state.restarts = 0;
      state.restartTimes = null;   // the last restart's page-clock times (ms), read by tests
      const maximumRestartsInARow = 3;
      const disconnectedGrace = 3000;

      // The session on the agent's side ends too (if it still exists), so the place is freed.
      function release() {
        // `released`: the DELETE's HTTP status once answered (or 0 when it failed), read by tests.
        if (state.resource) fetch(state.resource, { method: 'DELETE', headers: auth, keepalive: true })
          .then(reply => { state.released = reply.status; }, () => { state.released = 0; });
        state.resource = null;
      }

      function finish(text) {
        if (state.ended) return;
        state.ended = true;
        say(text, 'ended');
        clearInterval(statsTimer);
        if (pc) { pc.close(); pc = null; }
        release();
      }

      function retryLater(text, seconds) {
        say(text + ' Trying again in ' + seconds + ' s.', 'warn');
        setTimeout(connect, seconds * 1000);
      }

      async function connect() {
        if (state.ended) return;
        say('Connecting…');
        pc = new RTCPeerConnection({ iceServers: [] });
        const peer = pc;
        peer.addTransceiver('video', { direction: 'recvonly' });
        peer.ontrack = (event) => {
          video.srcObject = event.streams[0] || new MediaStream([event.track]);
          // The agent's end of a run closes DTLS (close_notify) at once; the connection's own state
          // takes ~2 s more to notice, and the page said "Watching" over the last, frozen picture.
          const transport = event.receiver.transport;
          if (transport) transport.onstatechange = () => {
            if (peer === pc && transport.state === 'closed') finish('Sharing ended: the agent closed the connection.');
          };
        };
        peer.onconnectionstatechange = () => {
          const s = peer.connectionState;
          if (s === 'connected' && !restarting) showLive();
          else if (s === 'disconnected' && !restarting) say('The connection is interrupted…', 'warn');
          else if (s === 'closed') finish('The connection was closed: sharing ended.');
          // 'failed' is ICE's: the restart below answers it (and ends the page if that fails).
        };
        peer.oniceconnectionstatechange = () => {
          const s = peer.iceConnectionState;
          clearTimeout(disconnectedTimer);
          if (s === 'connected' || s === 'completed') restartsInARow = 0;
          else if (s === 'failed') restartIce(peer, 'ICE failed');
          else if (s === 'disconnected') disconnectedTimer = setTimeout(() => restartIce(peer, 'ICE disconnected'), disconnectedGrace);
        };
        // POSTed without waiting for ICE gathering (~150 ms of the first frame's time): the agent is
        // ICE-lite, so it never checks toward our candidates; our checks reach it and it learns us from them.
        await peer.setLocalDescription(await peer.createOffer());
        let response;
        try {
          state.offerSent = true;
          response = await fetch('/whep', { method: 'POST', headers: Object.assign({ 'Content-Type': 'application/sdp' }, auth),
                                            body: peer.localDescription.sdp });
        } catch (error) {
          peer.close(); pc = null;
          return retryLater('The agent cannot be reached.', 5);
        }
        if (response.status === 201) {
          state.resource = response.headers.get('Location');
          try {
            await peer.setRemoteDescription({ type: 'answer', sdp: await response.text() });
            state.answered = true;
          } catch (error) {
            return finish('The agent\\'s answer cannot be used: ' + error.message);
          }
          return;
        }
        const text = (await response.text()).trim();
        peer.close(); pc = null;
        if (response.status === 401) return finish('This viewer needs its access token: open the whole URL the agent printed (it ends in #token=…).');
        if (response.status === 503) return retryLater(text, Number(response.headers.get('Retry-After')) || 10);
        if (response.status === 410) return finish('Sharing has ended.');
        finish('The agent did not accept this viewer (' + response.status + '): ' + text);
      }

      // Our offer's ICE lines as an sdpfrag (RFC 8840; RFC 9725 §4.3.2): credentials, the first
      // m-line with its mid and candidates (everything is bundled on it).
      function iceFragment(sdp) {
        const head = [], media = [];
        let section = 0;
        for (const line of sdp.split(/\\r?\\n/)) {
          if (line.startsWith('m=')) { section += 1; if (section === 1) media.push(line); continue; }
          if (section > 1) continue;
          if (/^a=ice-(ufrag|pwd):/.test(line)) { if (!head.some((l) => l.split(':')[0] === line.split(':')[0])) head.push(line); }
          else if (section === 1 && /^a=(mid:|candidate:|end-of-candidates)/.test(line)) media.push(line);
        }
        return head.concat(media).map((l) => l + '\\r\\n').join('');
      }

      // The answer we hold with the agent's new credentials and candidates in place of the old ones:
      // nothing else changes in an ICE restart.
      function withIce(answer, fragment) {
        const lines = fragment.split(/\\r?\\n/);
        const ufrag = lines.find((l) => l.startsWith('a=ice-ufrag:'));
        const pwd = lines.find((l) => l.startsWith('a=ice-pwd:'));
        if (!ufrag || !pwd) throw new Error('the agent\\'s restart answer has no ICE credentials');
        const candidates = lines.filter((l) => l.startsWith('a=candidate:') || l === 'a=end-of-candidates');
        const out = [];
        let section = 0;
        for (const line of answer.split(/\\r?\\n/)) {
          if (!line) continue;
          if (line.startsWith('m=')) { if (section === 1) out.push(...candidates); section += 1; }
          if (line.startsWith('a=ice-ufrag:')) out.push(ufrag);
          else if (line.startsWith('a=ice-pwd:')) out.push(pwd);
          else if (!line.startsWith('a=candidate:') && line !== 'a=end-of-candidates') out.push(line);
        }
        if (section === 1) out.push(...candidates);
        return out.map((l) => l + '\\r\\n').join('');
      }

      // WHEP's ICE restart: new credentials in a new offer, PATCHed with If-Match: *; the agent
      // answers with its own new ones. DTLS and the video go on; only the path is looked for again.
      function restartIce(peer, why) {
        if (restarting) return restarting;
        if (state.ended || peer !== pc || !state.resource) return Promise.resolve({ restarted: false, why: 'no session' });
        if (restartsInARow >= maximumRestartsInARow) {
          finish('The connection failed: sharing ended, or the network is in the way (' + why + ', ' + restartsInARow + ' restarts did not help).');
          return Promise.resolve({ restarted: false, why: 'gave up' });
        }
        restartsInARow += 1;
        state.restarts += 1;
        say('Reconnecting…', 'warn');
        const times = { asked: performance.now() };
        state.restartTimes = times;
        restarting = (async () => {
          peer.restartIce();
          await peer.setLocalDescription(await peer.createOffer());
          let response;
          try {
            times.patched = performance.now();
            response = await fetch(state.resource, {
              method: 'PATCH', body: iceFragment(peer.localDescription.sdp),
              headers: Object.assign({ 'Content-Type': 'application/trickle-ice-sdpfrag', 'If-Match': '*' }, auth) });
          } catch (error) {
            finish('Sharing ended: the agent is gone.');
            return { restarted: false, why: 'unreachable' };
          }
          times.answered = performance.now();
          if (response.status === 404 || response.status === 501) {
            // The agent forgot this session (or cannot restart): start a new one.
            state.resource = null;
            peer.close();
            if (pc === peer) pc = null;
            setTimeout(connect, 0);
            return { restarted: false, status: response.status, why: 'new session' };
          }
          if (response.status !== 200) {
            const text = (await response.text()).trim();
            finish('The agent refused to reconnect this viewer (' + response.status + '): ' + text);
            return { restarted: false, status: response.status };
          }
          state.etag = response.headers.get('ETag');
          await peer.setRemoteDescription({ type: 'answer', sdp: withIce(peer.remoteDescription.sdp, await response.text()) });
          times.applied = performance.now();
          return { restarted: true, status: 200, times };
        })().catch((error) => {
          finish('The viewer could not reconnect: ' + error.message);
          return { restarted: false, why: error.message };
        }).finally(() => {
          restarting = null;
          if (!state.ended && pc === peer && peer.connectionState === 'connected') {
            restartsInARow = 0;   // connected again (ICE may never have left 'connected': an asked restart)
            showLive();
          }
        });
        return restarting;
      }
      window.kraklRestartIce = () => (pc ? restartIce(pc, 'asked') : Promise.resolve({ restarted: false, why: 'no connection' }));

      async function showStats() {
        if (!pc) return;
        const report = await pc.getStats();
        let inbound = null, pairId = null;
        const pairs = {};
        report.forEach((s) => {
          if (s.type === 'inbound-rtp' && s.kind === 'video') inbound = s;
          if (s.type === 'transport' && s.selectedCandidatePairId) pairId = s.selectedCandidatePairId;
          if (s.type === 'candidate-pair') pairs[s.id] = s;
        });
        if (inbound) {
          show('resolution', inbound.frameWidth ? inbound.frameWidth + '×' + inbound.frameHeight : '–');
          show('fps', inbound.framesPerSecond !== undefined ? inbound.framesPerSecond.toFixed(0) : '–');
          if (last && inbound.timestamp > last.time) {
            show('bitrate', ((inbound.bytesReceived - last.bytes) * 8 / (inbound.timestamp - last.time)).toFixed(0) + ' kbit/s');
          }
          last = { bytes: inbound.bytesReceived, time: inbound.timestamp };
        }
        const pair = pairs[pairId];
        show('rtt', pair && pair.currentRoundTripTime !== undefined ? (pair.currentRoundTripTime * 1000).toFixed(0) + ' ms' : '–');
      }

      async function checkStatus() {
        if (state.ended) return;
        try {
          const response = await fetch('/status', { headers: auth, cache: 'no-store' });
          if (!response.ok) return;
          const status = await response.json();
          show('viewers', status.viewers + ' of ' + status.maximumViewers);
          if (status.ended) return finish('Sharing ended: ' + status.ended);
          const idle = status.idle || null;
          if (idle !== state.idle) {
            state.idle = idle;
            if (pc && pc.connectionState === 'connected' && !restarting) showLive();
            else if (idle && !state.answered) say(idle, 'warn');
          }
        } catch (error) {
          if (state.answered && (!pc || pc.connectionState !== 'connected')) finish('Sharing ended: the agent is gone.');
        }
      }

      // Leaving the page ends the session at once (the agent frees the viewer's place).
      addEventListener('pagehide', release);

      statsTimer = setInterval(() => { showStats().catch(() => {}); }, 1000);
      setInterval(() => { checkStatus(); }, 3000);
      checkStatus();
      connect().catch((error) => finish('The viewer failed: ' + error.message));
    })();

    """
}
