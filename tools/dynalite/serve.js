// serve.js runs dynalite's own command line (same flags) in a process that
// survives clients hanging up mid-request.
//
// dynalite rethrows a request stream's error from inside its event handler,
// so one client that closes its connection before its body is sent (a
// cancelled context, a killed process, a fault proxy cutting the link) kills
// the emulator and every test that shares it. DynamoDB itself shrugs that
// off. Only that error is ignored: the request is gone, the server is not.
// Anything else still ends the process with the error printed.
'use strict'

process.on('uncaughtException', function (err) {
  if (err && err.code === 'ECONNRESET' && err.message === 'aborted') {
    console.error('serve.js: a client hung up mid-request; request dropped')
    return
  }
  console.error(err)
  process.exit(1)
})

require('dynalite/cli.js')
