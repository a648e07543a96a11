'use strict';
// Express from the project's install (npm install -g express, pinned in .ci/run). Not a test
// file: the suites require it.

const path = require('node:path');
const { execFileSync } = require('node:child_process');

function loadExpress() {
  try {
    return require('express');
  } catch {
    try {
      const root = execFileSync('npm', ['root', '-g'], { encoding: 'utf8' }).trim();
      return require(path.join(root, 'express'));
    } catch (error) {
      if (process.env.CI === 'true') throw error;
      return null;
    }
  }
}

module.exports = { loadExpress };
