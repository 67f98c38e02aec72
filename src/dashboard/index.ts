export { evalData, getTrajectory, listTrajectories, runData, scanDirs } from './data.js';
export { type Dashboard, type DashboardOptions, startDashboard } from './server.js';
export { type TrajectoryView, type TurnView, viewTrajectory } from './turns.js';
