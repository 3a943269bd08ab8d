// An Express app behind spindle in the tests: it answers every request with what it understood
// of it, as JSON, and prints the same as a line (the fields
// tests/integration/test_framework_upstreams.py compares with what the gateway judged). An upgrade to WebSocket is accepted (101) and the same JSON sent as one
// text message. Usage: node echo.js NAME (NODE_PATH: build/tools/express/node_modules); prints
// {"address": "127.0.0.1:PORT"} once listening.
'use strict';
const crypto = require('crypto');
const express = require('express');
const cookieParser = require('cookie-parser');

const name = process.argv[2];
const app = express();
app.use(cookieParser());

function basicUser(authorization) {
  const match = /^basic +(.*)$/i.exec(authorization || '');
  if (!match) return null;
  const text = Buffer.from(match[1], 'base64').toString('latin1');
  const colon = text.indexOf(':');
  return colon < 0 ? null : text.slice(0, colon);
}

function understood(req, cookies) {
  const seen = describe(req, cookies);
  console.log(JSON.stringify(seen));
  return seen;
}

function describe(req, cookies) {
  const url = req.url;
  const question = url.indexOf('?');
  const fields = [];
  for (let i = 0; i < req.rawHeaders.length; i += 2) fields.push([req.rawHeaders[i], req.rawHeaders[i + 1]]);
  const h = req.headers;
  return {
    framework: name,
    method: req.method,
    host: h.host === undefined ? null : h.host,
    path: question < 0 ? url : url.slice(0, question),
    query: question < 0 ? '' : url.slice(question + 1),
    authorization: h.authorization === undefined ? null : h.authorization,
    basic_user: basicUser(h.authorization),
    user: h['x-user'] === undefined ? null : h['x-user'],
    role: h['x-role'] === undefined ? null : h['x-role'],
    cookies,
    request_id: h['x-request-id'] === undefined ? null : h['x-request-id'],
    forwarded_for: h['x-forwarded-for'] === undefined ? null : h['x-forwarded-for'],
    forwarded_host: h['x-forwarded-host'] === undefined ? null : h['x-forwarded-host'],
    forwarded_proto: h['x-forwarded-proto'] === undefined ? null : h['x-forwarded-proto'],
    forwarded_uri: h['x-forwarded-uri'] === undefined ? null : h['x-forwarded-uri'],
    forwarded_method: h['x-forwarded-method'] === undefined ? null : h['x-forwarded-method'],
    fields,
  };
}

app.all('*', (req, res) => res.json(understood(req, req.cookies)));

const server = app.listen(0, '127.0.0.1', () => {
  console.log(JSON.stringify({address: `127.0.0.1:${server.address().port}`}));
});

// A WebSocket handshake (RFC 6455): 101 with the key's accept, then the JSON as one unmasked
// text frame, then the close.
server.on('upgrade', (req, socket) => {
  const key = req.headers['sec-websocket-key'] || '';
  const accept = crypto.createHash('sha1')
      .update(key + '258EAFA5-E914-47DA-95CA-C5AB0DC85B11').digest('base64');
  const cookies = {};
  cookieParser()(req, {}, () => Object.assign(cookies, req.cookies));
  const payload = Buffer.from(JSON.stringify(understood(req, cookies)));
  const head = payload.length < 126 ? Buffer.from([0x81, payload.length])
      : Buffer.from([0x81, 126, payload.length >> 8, payload.length & 0xff]);
  socket.write('HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\n' +
               `Connection: Upgrade\r\nSec-WebSocket-Accept: ${accept}\r\n\r\n`);
  socket.end(Buffer.concat([head, payload]));
});
